package chart

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// An image is a FROM-scratch image assembled from files of this machine:
// each file at its path in the image, the shared libraries its ELF files
// need (found with ldd) at the paths the host's loader has them, busybox
// with its applets in /bin.
type image struct {
	files    map[string]string // path in the image: file on the host
	links    map[string]string // path in the image: symlink target
	entry    []string
	elfFiles []string // the image paths ldd is asked about
}

func newImage(entry ...string) *image {
	return &image{files: map[string]string{}, links: map[string]string{}, entry: entry}
}

// add puts host file src at dst; elf says its libraries come along.
func (im *image) add(src, dst string, elf bool) {
	im.files[dst] = src
	if elf {
		im.elfFiles = append(im.elfFiles, dst)
	}
}

// addBusybox adds a static busybox and a link for each of its applets.
func (im *image) addBusybox(busybox string) error {
	im.add(busybox, "/bin/busybox", false)
	out, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" {
			im.links["/bin/"+a] = "busybox"
		}
	}
	return nil
}

// lddLine is one library in ldd's answer: "libc.so.6 => /lib/.../libc.so.6 (0x...)"
// or the loader's "/lib64/ld-linux-x86-64.so.2 (0x...)".
var lddLine = regexp.MustCompile(`^\s*(?:\S+ => )?(/\S+) \(0x[0-9a-f]+\)$`)

// addLibraries adds what ldd says each ELF file needs, except libraries the
// image already holds by name (simgpu's, found through an rpath).
func (im *image) addLibraries() error {
	have := map[string]bool{}
	for dst := range im.files {
		have[path.Base(dst)] = true
	}
	for _, dst := range im.elfFiles {
		out, err := exec.Command("ldd", im.files[dst]).Output()
		if err != nil {
			return fmt.Errorf("ldd %s: %w", im.files[dst], err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			m := lddLine.FindStringSubmatch(line)
			if m == nil || have[path.Base(m[1])] {
				continue
			}
			im.files[m[1]] = m[1]
		}
	}
	return nil
}

// write makes the image a docker-archive tar (what `ctr images import`
// reads) named name, at file.
func (im *image) write(name, file string) error {
	layer, err := im.layer()
	if err != nil {
		return err
	}
	sum := sha256.Sum256(layer)
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Env": []string{"PATH=/bin:/usr/local/bin"}, "Entrypoint": im.entry},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + hex.EncodeToString(sum[:])}},
	})
	if err != nil {
		return err
	}
	manifest, err := json.Marshal([]map[string]any{{"Config": "config.json", "RepoTags": []string{name}, "Layers": []string{"layer.tar"}}})
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range []struct {
		name string
		data []byte
	}{{"manifest.json", manifest}, {"config.json", config}, {"layer.tar", layer}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := tw.Write(f.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return os.WriteFile(file, buf.Bytes(), 0o644)
}

// layer is the one layer: directories, files (their content, symlinks on
// the host followed) and links, in path order, all owned by root.
func (im *image) layer() ([]byte, error) {
	dirs := map[string]bool{"tmp": true}
	var paths []string
	for p := range im.files {
		paths = append(paths, p)
	}
	for p := range im.links {
		paths = append(paths, p)
	}
	for _, p := range paths {
		for d := path.Dir(strings.TrimPrefix(p, "/")); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	var ds []string
	for d := range dirs {
		ds = append(ds, d)
	}
	sort.Strings(ds)
	for _, d := range ds {
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Name: d + "/", Mode: mode, Typeflag: tar.TypeDir}); err != nil {
			return nil, err
		}
	}
	sort.Strings(paths)
	for _, p := range paths {
		name := strings.TrimPrefix(p, "/")
		if target, ok := im.links[p]; ok {
			if err := tw.WriteHeader(&tar.Header{Name: name, Linkname: target, Mode: 0o777, Typeflag: tar.TypeSymlink}); err != nil {
				return nil, err
			}
			continue
		}
		src := im.files[p]
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("image file %s: %w", p, err)
		}
		st, err := os.Stat(src)
		if err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: int64(st.Mode().Perm()), Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// importImage builds the test's one image from the repository's bin/ and
// imports it with ctr into the cluster's containerd at the socket
// containerd, and into node 2's (GPUWARDEN_K8S_NODE2_CONTAINERD, where
// cluster.sh set it), so that the chart's pods can run on either node:
// gpuwarden as the entrypoint, the interposer where the
// chart's init container copies it from, simgpu's libraries and workload,
// busybox for the init container's and the workloads' shells, unshare for
// the workloads' cgroup namespace.
func importImage(repo, name, ctr, containerd, dir string) error {
	im := newImage("/usr/local/bin/gpuwarden")
	bin := filepath.Join(repo, "bin")
	im.add(filepath.Join(bin, "gpuwarden"), "/usr/local/bin/gpuwarden", true)
	im.add(filepath.Join(bin, "libgpuwarden.so"), "/usr/local/gpuwarden/lib/libgpuwarden.so", true)
	// The remote part's files, where the chart's defaults look for them: the
	// worker and the interposer preloaded into it (remote.interposer's
	// default) beside the binary, the client library at
	// remote.libraryImagePath. Their libraries are libc's, which the
	// interposer already brings.
	im.add(filepath.Join(bin, "gpuwarden-worker"), "/usr/local/bin/gpuwarden-worker", false)
	im.links["/usr/local/bin/libgpuwarden.so"] = "../gpuwarden/lib/libgpuwarden.so"
	im.add(filepath.Join(bin, "remote", "libgpuwarden-remote.so"), "/usr/local/gpuwarden/remote/libgpuwarden-remote.so", false)
	im.links["/usr/local/gpuwarden/remote/libcuda.so.1"] = "libgpuwarden-remote.so"
	im.links["/usr/local/gpuwarden/remote/libnvidia-ml.so.1"] = "libgpuwarden-remote.so"
	for _, f := range []string{"libcuda.so.1", "libnvidia-ml.so.1", "workload"} {
		im.add(filepath.Join(bin, "simgpu", f), "/usr/local/simgpu/"+f, true)
	}
	// util-linux's unshare: busybox's cannot make a cgroup namespace (see workloadPod).
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	im.add(unshare, "/usr/bin/unshare", true)
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		return fmt.Errorf("busybox: %w", err)
	}
	if err := im.addBusybox(busybox); err != nil {
		return err
	}
	if err := im.addLibraries(); err != nil {
		return err
	}
	// simgpu's libcuda.so.1 where a GPU node's container runtime puts the
	// driver's, beside libc: the remote sessions' worker (no rpath) loads it
	// by name. The workloads find it through their rpath, and remote
	// clients' LD_LIBRARY_PATH comes first.
	for dst := range im.files {
		if path.Base(dst) == "libc.so.6" {
			im.links[path.Join(path.Dir(dst), "libcuda.so.1")] = "/usr/local/simgpu/libcuda.so.1"
		}
	}
	file := filepath.Join(dir, "gpuwarden-image.tar")
	if err := im.write(name, file); err != nil {
		return err
	}
	sockets := []string{containerd}
	if node2 := os.Getenv("GPUWARDEN_K8S_NODE2_CONTAINERD"); node2 != "" && node2 != containerd {
		sockets = append(sockets, node2)
	}
	for _, sock := range sockets {
		out, err := exec.Command(ctr, "--address", sock, "-n", "k8s.io", "images", "import", file).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ctr images import (%s): %w: %s", sock, err, out)
		}
	}
	return nil
}
