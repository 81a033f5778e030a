/* Taking over a session's connection from the agent (proto.h). */
#ifndef GPUWARDEN_REMOTE_HANDOVER_H
#define GPUWARDEN_REMOTE_HANDOVER_H

#include "proto.h"
#include "tls13.h"

/* gwr_recv_hdr reads a frame header from the agent's socket; *fd gets the
 * socket attached to it, or -1. 0, or -1: the socket ended first. */
int gwr_recv_hdr(int sock, uint8_t hdr[GWR_HDR_SIZE], int *fd);

/* A handover frame's suite for a plain socket: a same-node worker's own,
 * frames without TLS. */
#define GWR_HANDOVER_PLAIN 0

/* gwr_handover_take continues the session on fd from a handover frame
 * (its header and payload): *tls gets its record layer, or NULL for a
 * plain socket. 0, or -1 (errno) if the frame is not one or the record
 * layer cannot take it. */
int gwr_handover_take(const struct gwr_hdr *h, const uint8_t *payload, int fd, struct gwr_tls **tls);

#endif
