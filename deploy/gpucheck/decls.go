package gpucheck

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// decl is one thing simgpu's headers declare that must be as NVIDIA's are.
type decl struct {
	kind   string // function, value (enum constant or #define), sizeof, offsetof
	name   string // function, constant or type name
	field  string // offsetof: the member
	ret    string // function: return type
	params string // function: "(...)"
}

func (d decl) String() string {
	if d.kind == "offsetof" {
		return d.name + "." + d.field
	}
	return d.name
}

// headerDecls is what one of simgpu's headers declares.
type headerDecls struct {
	header string // cuda.h or nvml.h
	funcs  []decl
	layout []decl // values, sizes and offsets
}

var (
	blockComment = regexp.MustCompile(`(?s)/\*.*?\*/`)
	lineComment  = regexp.MustCompile(`//[^\n]*`)
	cplusplus    = regexp.MustCompile(`(?s)#ifdef __cplusplus.*?#endif`)
	macroCall    = regexp.MustCompile(`\b[A-Z][A-Z0-9_]*\(\s*[A-Z][A-Z0-9_]*\s*\)`) // SIMGPU_CUDA_API(SIMGPU_DECLARE): no semicolon follows
	xEntry       = regexp.MustCompile(`X\(\s*([^,()]+?)\s*,\s*(\w+)\s*,\s*\(`)
	defineLine   = regexp.MustCompile(`^#\s*define\s+([A-Z][A-Z0-9_]*)\s+\(?\s*((?:0x[0-9A-Fa-f]+|[0-9]+)[uUlL]*)\s*\)?\s*$`)
	identAtEnd   = regexp.MustCompile(`([A-Za-z_]\w*)\s*$`)
	arraySuffix  = regexp.MustCompile(`\[[^\]]*\]`)
)

// Constants that differ from NVIDIA's by design.
var ownConstants = map[string]bool{"CUDA_VERSION": true, "NVML_API_VERSION": true}

// parseHeader reads the declarations of one of simgpu's headers: the
// functions (X-macro entries and plain prototypes), enum constants with
// explicit values, numeric #defines, and each defined struct's size and its
// top-level members' offsets.
func parseHeader(name, text string) headerDecls {
	h := headerDecls{header: name}
	text = blockComment.ReplaceAllString(text, " ")
	text = lineComment.ReplaceAllString(text, "")
	text = cplusplus.ReplaceAllString(text, "") // extern "C" { ... }: its braces would hide every declaration
	text = strings.ReplaceAll(text, "\\\n", " ")
	var code strings.Builder
	for _, line := range strings.Split(text, "\n") {
		t := strings.TrimSpace(line)
		if !strings.HasPrefix(t, "#") {
			code.WriteString(line + "\n")
			continue
		}
		if strings.Contains(t, "(X)") { // the list of entry points
			for _, m := range xEntry.FindAllStringSubmatchIndex(t, -1) {
				params, ok := balanced(t[m[1]-1:])
				if ok {
					h.funcs = append(h.funcs, decl{kind: "function", ret: t[m[2]:m[3]], name: t[m[4]:m[5]], params: params})
				}
			}
		} else if m := defineLine.FindStringSubmatch(t); m != nil && !ownConstants[m[1]] && !strings.HasSuffix(m[1], "_H") {
			h.layout = append(h.layout, decl{kind: "value", name: m[1]})
		}
	}
	for _, st := range statements(macroCall.ReplaceAllString(code.String(), "")) {
		switch {
		case strings.HasPrefix(st, "typedef enum"):
			h.layout = append(h.layout, enumValues(st)...)
		case strings.HasPrefix(st, "typedef struct") || strings.HasPrefix(st, "typedef union"):
			h.layout = append(h.layout, structLayout(st)...)
		case !strings.HasPrefix(st, "typedef") && !strings.HasPrefix(st, "extern") && strings.Contains(st, "("):
			if d, ok := prototype(st); ok {
				h.funcs = append(h.funcs, d)
			}
		}
	}
	return h
}

// balanced returns the parenthesised text s starts with.
func balanced(s string) (string, bool) {
	depth := 0
	for i, c := range s {
		switch c {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return s[:i+1], true
			}
		}
	}
	return "", false
}

// statements splits C code into top-level statements at semicolons outside
// braces, whitespace collapsed.
func statements(code string) []string {
	var out []string
	depth, start := 0, 0
	for i, c := range code {
		switch c {
		case '{':
			depth++
		case '}':
			depth--
		case ';':
			if depth == 0 {
				if s := strings.Join(strings.Fields(code[start:i]), " "); s != "" {
					out = append(out, s)
				}
				start = i + 1
			}
		}
	}
	return out
}

// prototype reads "ret [CUDAAPI] name(params)".
func prototype(st string) (decl, bool) {
	open := strings.Index(st, "(")
	if open < 0 || !strings.HasSuffix(st, ")") {
		return decl{}, false
	}
	head := strings.NewReplacer("CUDAAPI", "", "DECLDIR", "").Replace(st[:open])
	m := identAtEnd.FindStringSubmatchIndex(head)
	if m == nil {
		return decl{}, false
	}
	ret := strings.TrimSpace(head[:m[2]])
	if ret == "" {
		return decl{}, false
	}
	return decl{kind: "function", ret: ret, name: head[m[2]:m[3]], params: st[open:]}, true
}

// enumValues reads the constants with explicit values of a typedef enum.
func enumValues(st string) []decl {
	body := st[strings.Index(st, "{")+1 : strings.LastIndex(st, "}")]
	var out []decl
	for _, item := range strings.Split(body, ",") {
		if name, _, ok := strings.Cut(item, "="); ok {
			out = append(out, decl{kind: "value", name: strings.TrimSpace(name)})
		}
	}
	return out
}

// structLayout reads a defined struct or union: its size and its named
// top-level members' offsets.
func structLayout(st string) []decl {
	open, end := strings.Index(st, "{"), strings.LastIndex(st, "}")
	if open < 0 || end < open {
		return nil
	}
	m := identAtEnd.FindStringSubmatch(st[end+1:])
	if m == nil {
		return nil
	}
	typ := m[1]
	out := []decl{{kind: "sizeof", name: typ}}
	for _, member := range statements(st[open+1 : end]) {
		if i := strings.LastIndex(member, "}"); i >= 0 { // a nested struct or union: its name follows it
			member = member[i+1:]
		}
		for _, part := range strings.Split(arraySuffix.ReplaceAllString(member, ""), ",") {
			if f := identAtEnd.FindStringSubmatch(part); f != nil && f[1] != "pad" && !strings.HasPrefix(f[1], "reserved") {
				out = append(out, decl{kind: "offsetof", name: typ, field: f[1]})
			}
		}
	}
	return out
}

// readSimHeaders parses the bundle's copies of simgpu's headers.
func (e *env) readSimHeaders() ([]headerDecls, error) {
	var out []headerDecls
	for _, name := range []string{"cuda.h", "nvml.h"} {
		b, err := os.ReadFile(e.bundlePath("include", "simgpu", name))
		if err != nil {
			return nil, fmt.Errorf("read simgpu's %s: %w", name, err)
		}
		out = append(out, parseHeader(name, string(b)))
	}
	return out, nil
}

// nvidiaHeaders finds the directory of NVIDIA's name (cuda.h, nvml.h).
func (e *env) nvidiaHeaders(name string) (string, error) {
	if e.o.Simulate {
		return e.bundlePath("include", "simgpu"), nil
	}
	var dirs []string
	if e.o.CUDAInclude != "" {
		dirs = append(dirs, e.o.CUDAInclude)
	}
	for _, v := range []string{"CUDA_HOME", "CUDA_PATH"} {
		if d := os.Getenv(v); d != "" {
			dirs = append(dirs, filepath.Join(d, "include"))
		}
	}
	if nvcc, err := exec.LookPath("nvcc"); err == nil {
		if real, err := filepath.EvalSymlinks(nvcc); err == nil {
			nvcc = real
		}
		dirs = append(dirs, filepath.Join(filepath.Dir(nvcc), "..", "include"))
	}
	dirs = append(dirs, "/usr/local/cuda/include", "/usr/local/cuda/targets/x86_64-linux/include", "/usr/include")
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, name)); err == nil {
			return filepath.Clean(d), nil
		}
	}
	return "", fmt.Errorf("NVIDIA's %s is not in %s (set --cuda-include)", name, strings.Join(dirs, ", "))
}

func cCompiler() (string, error) {
	for _, c := range []string{"gcc", "cc"} {
		if p, err := exec.LookPath(c); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("no C compiler (gcc or cc) on PATH")
}

// compiler runs cc in the C locale, so its messages quote types in ASCII.
func compiler(ctx context.Context, cc string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, cc, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd
}

// compileErrors compiles src (one check a line) with cc and returns the
// first error message of each erroring line.
func compileErrors(ctx context.Context, cc, src string, args ...string) (map[int]string, string, error) {
	file := src + ".c"
	out, err := compiler(ctx, cc, append([]string{"-std=gnu11", "-fmax-errors=0", "-w", "-o", src, file}, args...)...).CombinedOutput()
	errs := map[int]string{}
	lineRe := regexp.MustCompile(`^` + regexp.QuoteMeta(file) + `:(\d+):\d+: (?:fatal )?error: (.*)$`)
	for _, l := range strings.Split(string(out), "\n") {
		if m := lineRe.FindStringSubmatch(l); m != nil {
			n, _ := strconv.Atoi(m[1])
			if _, seen := errs[n]; !seen {
				errs[n] = m[2]
			}
		}
	}
	if err != nil && len(errs) == 0 {
		return nil, string(out), fmt.Errorf("compile %s: %w: %s", filepath.Base(file), err, out)
	}
	return errs, string(out), nil
}

// checkDeclarations is part 1.
func checkDeclarations(ctx context.Context, e *env, r *Result) {
	cc, err := cCompiler()
	if err != nil {
		r.Fail("compiler", "%v", err)
		return
	}
	headers, err := e.readSimHeaders()
	if err != nil {
		r.Fail("simgpu's headers", "%v", err)
		return
	}
	var full strings.Builder
	for _, h := range headers {
		dir, err := e.nvidiaHeaders(h.header)
		if err != nil {
			r.Fail(h.header, "%v", err)
			continue
		}
		bad := e.checkFunctions(ctx, cc, dir, h, r)
		bad = append(bad, e.checkLayout(ctx, cc, dir, h, r)...)
		fmt.Fprintf(&full, "## %s (NVIDIA's: %s)\n\n", h.header, filepath.Join(dir, h.header))
		if len(bad) == 0 {
			full.WriteString("Everything matches.\n\n")
		}
		for _, b := range bad {
			fmt.Fprintf(&full, "- %s\n", b)
		}
		full.WriteString("\n")
	}
	if err := os.WriteFile(filepath.Join(e.o.Out, "declarations.md"), []byte("# Declarations: simgpu against NVIDIA\n\n"+full.String()), 0o644); err == nil {
		r.Note("Every mismatch, with the compiler's words: declarations.md beside this report.")
	}
}

// cudaVariants are the ways NVIDIA's cuda.h declares its symbols: plainly,
// with per-thread default stream names, and with every versioned and legacy
// name (as the driver's own sources build it).
var cudaVariants = map[string][]string{
	"plain":      nil,
	"per-thread": {"-DCUDA_API_PER_THREAD_DEFAULT_STREAM=1"},
	"internal":   {"-D__CUDA_API_VERSION_INTERNAL=1"},
}

// checkFunctions compiles, against NVIDIA's header, an assertion per simgpu
// function that its prototype is NVIDIA's, and returns the mismatches.
func (e *env) checkFunctions(ctx context.Context, cc, dir string, h headerDecls, r *Result) []string {
	variants := map[string][]string{"plain": {"-DNVML_NO_UNVERSIONED_FUNC_DEFS=1"}}
	if h.header == "cuda.h" {
		variants = cudaVariants
	}
	results := map[string]map[string]string{} // variant -> function -> error ("" ok)
	for v, defs := range variants {
		var src strings.Builder
		lines := map[int]string{}
		// Spelled out on one line each, not through a macro: the compiler
		// reports a failed assertion where it is written.
		fmt.Fprintf(&src, "#include <%s>\n", h.header)
		n := 2
		for _, f := range h.funcs {
			fmt.Fprintf(&src, "#ifdef %s\n#undef %s\n#endif\n_Static_assert(__builtin_types_compatible_p(__typeof__(&%s), %s (*)%s), \"%s\");\n",
				f.name, f.name, f.name, f.ret, f.params, f.name)
			n += 4
			lines[n-1] = f.name
		}
		path := filepath.Join(e.work, "decl-"+strings.TrimSuffix(h.header, ".h")+"-"+v)
		_ = os.WriteFile(path+".c", []byte(src.String()), 0o644)
		errs, _, err := compileErrors(ctx, cc, path, append([]string{"-fsyntax-only", "-I", dir}, defs...)...)
		if err != nil {
			r.Fail(h.header+" functions", "%v", err)
			return nil
		}
		results[v] = map[string]string{}
		for _, f := range h.funcs {
			results[v][f.name] = ""
		}
		for line, msg := range errs {
			if name, ok := lines[line]; ok {
				results[v][name] = msg
			}
		}
	}
	var bad []string
	for _, f := range h.funcs {
		v := "plain"
		if strings.HasSuffix(f.name, "_ptsz") || strings.HasSuffix(f.name, "_ptds") {
			v = "per-thread"
		}
		msg := results[v][f.name]
		if strings.Contains(msg, "undeclared") && results["internal"] != nil {
			msg = results["internal"][f.name]
		}
		if msg != "" {
			bad = append(bad, fmt.Sprintf("function `%s%s`: %s", f.name, f.params, e.explain(ctx, cc, dir, h.header, f, msg)))
		}
	}
	r.Expect(len(bad) == 0, h.header+" functions", "%d of %d prototypes as NVIDIA's%s", len(h.funcs)-len(bad), len(h.funcs), listed(bad))
	return bad
}

// explain turns a failed assertion into NVIDIA's type for the function, by
// provoking the compiler to print it.
func (e *env) explain(ctx context.Context, cc, dir, header string, f decl, msg string) string {
	if !strings.Contains(msg, "static assertion") {
		return msg
	}
	path := filepath.Join(e.work, "explain-"+f.name)
	src := fmt.Sprintf("#include <%s>\n#undef %s\nint gw_show = &%s;\n", header, f.name, f.name)
	_ = os.WriteFile(path+".c", []byte(src), 0o644)
	out, _ := compiler(ctx, cc, "-fsyntax-only", "-I", dir, "-D__CUDA_API_VERSION_INTERNAL=1", "-DNVML_NO_UNVERSIONED_FUNC_DEFS=1", path+".c").CombinedOutput()
	if m := regexp.MustCompile(`from '([^']*)'`).FindStringSubmatch(string(out)); m != nil {
		return fmt.Sprintf("differs: NVIDIA's is `%s`, simgpu's `%s (*)%s`", m[1], f.ret, f.params)
	}
	return msg
}

// checkLayout compares the values of constants and the sizes and offsets of
// structs: the same program, built once against simgpu's header and once
// against NVIDIA's, prints them.
func (e *env) checkLayout(ctx context.Context, cc, dir string, h headerDecls, r *Result) []string {
	want, _, err := e.layoutValues(ctx, cc, e.bundlePath("include", "simgpu"), h)
	if err != nil {
		r.Fail(h.header+" layout", "simgpu's own header: %v", err)
		return nil
	}
	got, missing, err := e.layoutValues(ctx, cc, dir, h)
	if err != nil {
		r.Fail(h.header+" layout", "NVIDIA's header: %v", err)
		return nil
	}
	var bad []string
	for _, d := range h.layout {
		key := d.kind + " " + d.String()
		w, ok := want[key]
		if !ok {
			bad = append(bad, fmt.Sprintf("%s: simgpu's own header does not compile it (a gpu-check bug)", key))
		} else if msg, gone := missing[key]; gone {
			bad = append(bad, fmt.Sprintf("%s: not in NVIDIA's header (%s)", key, msg))
		} else if got[key] != w {
			bad = append(bad, fmt.Sprintf("%s: NVIDIA's %s, simgpu's %s", key, got[key], w))
		}
	}
	sort.Strings(bad)
	r.Expect(len(bad) == 0, h.header+" values and layouts", "%d of %d constants, sizes and offsets as NVIDIA's%s", len(h.layout)-len(bad), len(h.layout), listed(bad))
	return bad
}

// layoutValues builds and runs the layout program against the headers in
// dir. Lines that do not compile there are dropped (and returned, with the
// compiler's message) and the program built again without them.
func (e *env) layoutValues(ctx context.Context, cc, dir string, h headerDecls) (map[string]string, map[string]string, error) {
	items := append([]decl(nil), h.layout...)
	missing := map[string]string{}
	path := filepath.Join(e.work, fmt.Sprintf("layout-%s-%d", strings.TrimSuffix(h.header, ".h"), len(e.work)+len(dir)))
	for attempt := 0; attempt < 5; attempt++ {
		var src strings.Builder
		fmt.Fprintf(&src, "#include <stdio.h>\n#include <stddef.h>\n#include <%s>\nint main(void) {\n", h.header)
		const first = 5
		for _, d := range items {
			key := d.kind + " " + d.String()
			switch d.kind {
			case "value":
				fmt.Fprintf(&src, "printf(\"%s %%lld\\n\", (long long)(%s));\n", key, d.name)
			case "sizeof":
				fmt.Fprintf(&src, "printf(\"%s %%zu\\n\", sizeof(%s));\n", key, d.name)
			case "offsetof":
				fmt.Fprintf(&src, "printf(\"%s %%zu\\n\", offsetof(%s, %s));\n", key, d.name, d.field)
			}
		}
		src.WriteString("return 0;\n}\n")
		_ = os.WriteFile(path+".c", []byte(src.String()), 0o644)
		errs, _, err := compileErrors(ctx, cc, path, "-I", dir, "-DNVML_NO_UNVERSIONED_FUNC_DEFS=1")
		if err != nil {
			return nil, nil, err
		}
		if len(errs) == 0 {
			out, err := exec.CommandContext(ctx, path).Output()
			if err != nil {
				return nil, nil, fmt.Errorf("run the layout program: %w", err)
			}
			vals := map[string]string{}
			for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				if i := strings.LastIndex(l, " "); i > 0 {
					vals[l[:i]] = l[i+1:]
				}
			}
			return vals, missing, nil
		}
		var keep []decl
		for i, d := range items {
			if msg, bad := errs[first+i]; bad {
				missing[d.kind+" "+d.String()] = msg
			} else {
				keep = append(keep, d)
			}
		}
		if len(keep) == len(items) {
			return nil, nil, fmt.Errorf("the layout program does not compile: %v", errs)
		}
		items = keep
	}
	return nil, nil, fmt.Errorf("the layout program still does not compile after dropping what NVIDIA's header lacks")
}

// listed formats mismatches for a table cell: the first few, and a count.
func listed(bad []string) string {
	if len(bad) == 0 {
		return ""
	}
	const show = 6
	s := ": " + strings.Join(bad[:min(len(bad), show)], "; ")
	if len(bad) > show {
		s += fmt.Sprintf("; and %d more", len(bad)-show)
	}
	return s
}
