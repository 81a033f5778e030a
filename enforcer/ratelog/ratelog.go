// Package ratelog writes a log line that peers can provoke at will (a
// refused connection, a failed handshake) at most once per interval, and
// says how many it held back, so a flood costs the log a line a second,
// never megabytes.
package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Logger writes one message at one level, rate-limited.
type Logger struct {
	log   *slog.Logger
	level slog.Level
	msg   string
	every time.Duration

	mu      sync.Mutex
	last    time.Time // when a line was last written
	held    int       // lines held back since
	args    []any     // the latest held line's attributes
	pending bool      // a line for the held ones is due
}

// New writes msg at level through log at most once every interval.
func New(log *slog.Logger, level slog.Level, msg string, every time.Duration) *Logger {
	return &Logger{log: log, level: level, msg: msg, every: every}
}

// Log writes the message with args at once when the interval since the
// last line has passed; otherwise it holds it back, and when the interval
// ends one line stands for all held: the latest one's args and
// "suppressed", the number of the others.
func (l *Logger) Log(args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.held == 0 && now.Sub(l.last) >= l.every {
		l.last = now
		l.log.Log(context.Background(), l.level, l.msg, args...)
		return
	}
	l.held++
	l.args = args
	if !l.pending {
		l.pending = true
		time.AfterFunc(l.last.Add(l.every).Sub(now), l.flush)
	}
}

// flush writes the line that stands for the held ones.
func (l *Logger) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending = false
	if l.held == 0 {
		return
	}
	l.log.Log(context.Background(), l.level, l.msg, append(l.args[:len(l.args):len(l.args)], "suppressed", l.held-1)...)
	l.last, l.held, l.args = time.Now(), 0, nil
}
