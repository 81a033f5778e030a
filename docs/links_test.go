// The documentation's links: every relative link in README.md,
// deploy/README.md and docs/**/*.md must name a file or directory of the
// repository, and a link to a heading of a markdown file (`page.md#heading`,
// or `#heading` within the page) must name one of its headings, by GitHub's
// rule for heading anchors.
package docs_test

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// root is the repository's root, seen from this directory.
const root = ".."

// pages lists the markdown files whose links are checked, relative to root.
func pages(t *testing.T) []string {
	t.Helper()
	list := []string{"README.md"}
	if _, err := os.Stat(filepath.Join(root, "deploy", "README.md")); err == nil {
		list = append(list, "deploy/README.md")
	}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			list = append(list, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return list
}

var (
	fence      = regexp.MustCompile("^\\s*(```|~~~)")
	codeSpan   = regexp.MustCompile("(`+)[^`]*?(`+)")
	inlineLink = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	refDef     = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$`)
	htmlRef    = regexp.MustCompile(`<(?:a|img)\s[^>]*?(?:href|src)\s*=\s*"([^"]*)"`)
	scheme     = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	atxHeading = regexp.MustCompile(`^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	htmlAnchor = regexp.MustCompile(`<a\s[^>]*?(?:name|id)\s*=\s*"([^"]*)"`)
	mdLink     = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
)

// link is one link of a page.
type link struct {
	line   int
	target string
}

// lines returns a page's lines outside fenced code blocks, with code spans
// blanked (what they hold is code, not links), numbered from 1.
func lines(text string) map[int]string {
	out := map[int]string{}
	inFence := false
	for i, l := range strings.Split(text, "\n") {
		if fence.MatchString(l) {
			inFence = !inFence
			continue
		}
		if !inFence {
			out[i+1] = l
		}
	}
	return out
}

func linksOf(text string) []link {
	var found []link
	ls := lines(text)
	for n := 1; n <= len(strings.Split(text, "\n")); n++ {
		l, ok := ls[n]
		if !ok {
			continue
		}
		l = codeSpan.ReplaceAllStringFunc(l, func(s string) string { return strings.Repeat(" ", len(s)) })
		for _, m := range inlineLink.FindAllStringSubmatch(l, -1) {
			found = append(found, link{n, m[1]})
		}
		for _, m := range htmlRef.FindAllStringSubmatch(l, -1) {
			found = append(found, link{n, m[1]})
		}
		if m := refDef.FindStringSubmatch(l); m != nil {
			found = append(found, link{n, m[1]})
		}
	}
	return found
}

// slug is GitHub's anchor for a heading: its text as rendered (code spans
// and links reduced to their text), lower-cased, every character but
// letters, digits, spaces, hyphens and underscores dropped, and spaces
// turned into hyphens.
func slug(heading string) string {
	heading = mdLink.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors lists the anchors of a markdown page: its headings' slugs (a
// repeated one numbered -1, -2, ... as GitHub does) and explicit HTML
// anchors.
func anchors(text string) map[string]bool {
	set := map[string]bool{}
	seen := map[string]int{}
	ls := lines(text)
	for n := 1; n <= len(strings.Split(text, "\n")); n++ {
		l, ok := ls[n]
		if !ok {
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(l, -1) {
			set[m[1]] = true
		}
		m := atxHeading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		s := slug(m[2])
		if k := seen[s]; k > 0 {
			set[fmt.Sprintf("%s-%d", s, k)] = true
		} else {
			set[s] = true
		}
		seen[s]++
	}
	return set
}

// check returns what is wrong with one link of page, or "".
func check(page string, target string) string {
	if target == "" || scheme.MatchString(target) || strings.HasPrefix(target, "//") {
		return "" // empty, or not a file of the repository (http:, mailto:, ...)
	}
	path, frag, _ := strings.Cut(target, "#")
	p, err := url.PathUnescape(path)
	if err != nil {
		return fmt.Sprintf("%s: %v", target, err)
	}
	file := page // a bare #anchor is in the page itself
	if p != "" {
		if strings.HasPrefix(p, "/") {
			file = filepath.Clean(strings.TrimPrefix(p, "/"))
		} else {
			file = filepath.Join(filepath.Dir(page), p)
		}
		if file == ".." || strings.HasPrefix(file, "../") {
			return fmt.Sprintf("%s leads out of the repository", target)
		}
	}
	st, err := os.Stat(filepath.Join(root, file))
	if err != nil {
		return fmt.Sprintf("%s: no file %s in the repository", target, file)
	}
	if frag == "" || st.IsDir() || !strings.HasSuffix(file, ".md") {
		return ""
	}
	text, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		return err.Error()
	}
	if !anchors(string(text))[frag] {
		return fmt.Sprintf("%s: %s has no heading with the anchor #%s", target, file, frag)
	}
	return ""
}

func TestLinksResolve(t *testing.T) {
	checked := 0
	for _, page := range pages(t) {
		text, err := os.ReadFile(filepath.Join(root, page))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range linksOf(string(text)) {
			checked++
			if msg := check(page, l.target); msg != "" {
				t.Errorf("%s:%d: %s", page, l.line, msg)
			}
		}
	}
	// README.md alone links to a dozen pages: finding none means the
	// parsing broke, not that every link is good.
	if checked < 10 {
		t.Fatalf("only %d links found: the link parser is broken", checked)
	}
	t.Logf("%d links checked", checked)
}

// TestLinkRules checks the parser and GitHub's anchor rule on examples.
func TestLinkRules(t *testing.T) {
	for heading, want := range map[string]string{
		"On a real node: `make k8s-test`":  "on-a-real-node-make-k8s-test",
		"Breaches, and whom they can stop": "breaches-and-whom-they-can-stop",
		"`gpuwarden smi`":                  "gpuwarden-smi",
		"Launch gate (for the enforcer)":   "launch-gate-for-the-enforcer",
		"Paths, files and sockets":         "paths-files-and-sockets",
		"See [Metrics](metrics.md) here":   "see-metrics-here",
		"snake_case and Ünïcode":           "snake_case-and-ünïcode",
	} {
		if got := slug(heading); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}
	page := "# Title\n\n## Part\n\n## Part\n\n```\n## not a heading\n[not](a-link.md)\n```\n" +
		"A [link](other.md#part-1), `[code](no.md)`, ![pic](a.svg) and [site](https://example.com).\n\n[ref]: ref.md\n"
	var got []string
	for _, l := range linksOf(page) {
		got = append(got, l.target)
	}
	if want := []string{"other.md#part-1", "a.svg", "https://example.com", "ref.md"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("links: got %q, want %q", got, want)
	}
	as := anchors(page)
	for _, want := range []string{"title", "part", "part-1"} {
		if !as[want] {
			t.Errorf("anchors: no %q in %v", want, as)
		}
	}
	if as["not-a-heading"] {
		t.Errorf("anchors: a heading inside a code block counted")
	}
}
