package console

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The browser tests drive a real headless Chromium against the console of
// a real in-process cluster. Without a browser they skip, except in CI
// (CI set), where .ci/run installs Debian's chromium and a missing one is
// a failure. Each page they visit is kept as a screenshot in
// $FERRY_ARTIFACTS/console-screenshots (else the system's temporary
// directory), for a person to look at; they are never committed.

// browserPath finds Chromium or Chrome: Debian's binary itself first (its
// /usr/bin/chromium wrapper script only adds flags for a desktop).
func browserPath(t *testing.T) string {
	if _, err := os.Stat("/usr/lib/chromium/chromium"); err == nil {
		return "/usr/lib/chromium/chromium"
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no Chromium or Chrome on PATH: CI installs Debian's chromium (.ci/run)")
	}
	t.Skip("no Chromium or Chrome on PATH (apt-get install chromium); the browser tests skip")
	return ""
}

// screenshotDir is where the screenshots go.
func screenshotDir(t *testing.T) string {
	base := os.Getenv("FERRY_ARTIFACTS")
	if base == "" {
		base = os.TempDir()
	}
	dir := filepath.Join(base, "console-screenshots")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// chrome is one headless browser (its own profile: no shared cookies).
type chrome struct {
	t    *testing.T
	e    *env
	ctx  context.Context
	dir  string
	name string // whose session, for the screenshots' names
}

func (e *env) chrome(t *testing.T, name string) *chrome {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browserPath(t)),
		chromedp.NoSandbox, // CI runs as root
		chromedp.DisableGPU,
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	ctx, cancelTime := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() {
		cancelTime()
		cancelCtx()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("start the browser: %v", err)
	}
	return &chrome{t: t, e: e, ctx: ctx, dir: screenshotDir(t), name: name}
}

// do runs steps, failing the test on an error.
func (c *chrome) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	c.t.Helper()
	if err := chromedp.Do(c.ctx, steps...); err != nil {
		c.t.Fatalf("%s (as %s): %v", what, c.name, err)
	}
}

// get runs an action that gives a value, failing the test on an error.
func get[T any](c *chrome, what string, a chromedp.Action[T]) T {
	c.t.Helper()
	v, err := chromedp.Run(c.ctx, a)
	if err != nil {
		c.t.Fatalf("%s (as %s): %v", what, c.name, err)
	}
	return v
}

// login logs in with token through the login form.
func (c *chrome) login(token string) {
	c.t.Helper()
	c.do("log in",
		chromedp.Navigate(c.e.srv.URL+Prefix),
		chromedp.WaitVisible(chromedp.CSS(`#token-login input[name=token]`)),
		chromedp.SendKeys(chromedp.CSS(`#token-login input[name=token]`), token),
		chromedp.Submit(chromedp.CSS(`#token-login`)),
		chromedp.WaitVisible(chromedp.ID(`principal`)),
	)
}

var unsafeName = regexp.MustCompile(`[^a-zA-Z0-9_-]+`)

// visit opens a console path, waits for its heading, keeps a screenshot,
// and returns the heading and the error shown ("" when none).
func (c *chrome) visit(path string) (heading, shownError string) {
	c.t.Helper()
	c.do("open "+path, chromedp.Navigate(c.e.srv.URL+path), chromedp.WaitVisible(chromedp.CSS(`h1`)))
	heading = get(c, "read the heading of "+path, chromedp.Text(chromedp.CSS(`h1`)))
	errs := get(c, "read the errors of "+path, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("#error")).map(e => e.textContent)`))
	shot := get(c, "screenshot "+path, chromedp.FullScreenshot(80))
	file := filepath.Join(c.dir, fmt.Sprintf("%s-%s.jpg", c.name, strings.Trim(unsafeName.ReplaceAllString(path, "_"), "_")))
	if err := os.WriteFile(file, shot, 0o644); err != nil {
		c.t.Fatal(err)
	}
	return heading, strings.Join(errs, "; ")
}

// navLinks are the console paths the navigation shows.
func (c *chrome) navLinks() []string {
	c.t.Helper()
	return get(c, "read the navigation", chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("header nav a")).map(a => a.pathname + a.search)`))
}

// Every page in the navigation opens without an error for each kind of
// principal, the navigation shows what each may see, and a page a
// principal may not see is refused.
func TestBrowserWalksEveryPage(t *testing.T) {
	browserPath(t)
	e := startEnv(t, envOpts{auth: true})
	for _, who := range []struct {
		name  string
		perms []string
		// minLinks is how many pages the navigation shows at least.
		minLinks int
	}{
		{"admin", nil, 1},
		{"viewer", []string{"describe"}, 1},
	} {
		t.Run(who.name, func(t *testing.T) {
			tok := e.adminTok
			if who.perms != nil {
				tok = e.principal(t, who.name, who.perms...)
			}
			c := e.chrome(t, who.name)
			c.login(tok)
			links := c.navLinks()
			if len(links) < who.minLinks {
				t.Fatalf("the navigation shows %v, want at least %d pages", links, who.minLinks)
			}
			for _, l := range links {
				if h, shown := c.visit(l); shown != "" || h == "" {
					t.Errorf("%s: heading %q, error %q", l, h, shown)
				}
			}
		})
	}
	t.Run("refused", func(t *testing.T) {
		tok := e.principal(t, "app", "produce:orders")
		c := e.chrome(t, "app")
		c.login(tok)
		if _, shown := c.visit(Prefix); !strings.Contains(shown, "lacks describe") {
			t.Fatalf("the overview for a principal without describe shows %q, want a refusal naming describe", shown)
		}
	})
}
