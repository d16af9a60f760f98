package console

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/producer"
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
	shot := get(c, "screenshot "+path, chromedp.FullScreenshot(100))
	file := filepath.Join(c.dir, fmt.Sprintf("%s-%s.png", c.name, strings.Trim(unsafeName.ReplaceAllString(path, "_"), "_")))
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

// shot keeps a screenshot of the page shown now, named name.
func (c *chrome) shot(name string) {
	c.t.Helper()
	b := get(c, "screenshot "+name, chromedp.FullScreenshot(100))
	if err := os.WriteFile(filepath.Join(c.dir, c.name+"-"+name+".png"), b, 0o644); err != nil {
		c.t.Fatal(err)
	}
}

// acceptDialogs answers every confirm() the page asks with OK, as a person
// who means the action clicks it.
func (c *chrome) acceptDialogs() {
	dialogs := chromedp.Events(c.ctx, cdppage.JavascriptDialogOpening)
	go func() {
		for _, err := range dialogs {
			if err != nil {
				return
			}
			_, _ = chromedp.Call(c.ctx, cdppage.HandleJavaScriptDialog, cdppage.HandleJavaScriptDialogParams{Accept: true})
		}
	}()
}

// has reports whether the page shown now has an element matching css.
func (c *chrome) has(css string) bool {
	c.t.Helper()
	return get(c, "look for "+css, chromedp.Evaluate[bool](fmt.Sprintf("document.querySelector(%q) !== null", css)))
}

// Every page in the navigation, and the pages a row links to, open for
// each kind of principal without an error (or refused, naming what is
// missing, where the principal may not see them), and a page a principal
// may not see at all is refused.
func TestBrowserWalksEveryPage(t *testing.T) {
	browserPath(t)
	e := startEnv(t, envOpts{auth: true, edit: unlimited})
	billingSetup(t, e, false)
	linked := []string{Prefix + "consumer?group=billing", Prefix + "topic?name=orders", Prefix + "groups?group=g1",
		Prefix + "messages?topic=orders&queue=0&offset=0", Prefix + "consumer?group=billing&reset=orders"}
	for _, who := range []struct {
		name  string
		perms []string
		// refused are the linked pages the principal may not see, with
		// what the refusal names.
		refused map[string]string
	}{
		{"admin", nil, nil},
		{"viewer", []string{"describe"}, map[string]string{
			linked[3]: "lacks consume", linked[4]: "lacks admin"}},
		{"reader", []string{"consume:orders:billing"}, map[string]string{
			linked[2]: "lacks describe", linked[4]: "lacks admin"}},
	} {
		t.Run(who.name, func(t *testing.T) {
			tok := e.adminTok
			if who.perms != nil {
				tok = e.principal(t, who.name, who.perms...)
			}
			c := e.chrome(t, who.name)
			c.login(tok)
			links := c.navLinks()
			if len(links) < 2 {
				t.Fatalf("the navigation shows %v", links)
			}
			for _, l := range append(links, linked...) {
				h, shown := c.visit(l)
				want, refused := who.refused[l]
				switch {
				case h == "":
					t.Errorf("%s: no heading", l)
				case refused && !strings.Contains(shown, want):
					t.Errorf("%s: shows %q, want a refusal naming %q", l, shown, want)
				case !refused && shown != "":
					t.Errorf("%s: shows the error %q", l, shown)
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

// An operator resets a stopped group's offsets in the browser: the form is
// prefilled with the committed offsets, the preview says what each queue
// reads again, and only the confirm moves them.
func TestBrowserResetsOffsets(t *testing.T) {
	browserPath(t)
	e := startEnv(t, envOpts{auth: true, edit: unlimited})
	billingSetup(t, e, false) // orders: 10 and 4 messages; billing committed 6 and 1
	c := e.chrome(t, "admin")
	c.acceptDialogs()
	c.login(e.adminTok)
	c.do("open the reset form", chromedp.Navigate(e.srv.URL+Prefix+"consumer?group=billing&reset=orders"),
		chromedp.WaitVisible(chromedp.ID("reset-form")))
	prefilled := get(c, "read the prefilled offsets", chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll("#reset-offsets input")).map(i => i.value)`))
	if strings.Join(prefilled, ",") != "6,1" {
		t.Fatalf("the form is prefilled with %v, want the committed 6,1", prefilled)
	}
	c.shot("reset-form")
	c.do("preview a reset to the earliest", chromedp.Click(chromedp.CSS(`#reset-form input[value=earliest]`)),
		chromedp.Submit(chromedp.ID("reset-form")), chromedp.WaitVisible(chromedp.ID("reset-preview")))
	c.shot("reset-preview")
	row := get(c, "read the preview", chromedp.Text(chromedp.ID("preview-0")))
	if f := strings.Fields(row); len(f) < 7 || f[4] != "0" || f[6] != "6" {
		t.Fatalf("queue 0's preview row %q: want new offset 0, 6 read again", row)
	}
	if got := committed(t, e, "billing", "orders"); got[0] != 6 || got[1] != 1 {
		t.Fatalf("the preview moved the offsets: %v", got)
	}
	c.do("confirm", chromedp.Click(chromedp.CSS(`#reset-confirm button[type=submit]`)), chromedp.WaitVisible(chromedp.ID("reset-done")))
	c.shot("reset-done")
	if got := committed(t, e, "billing", "orders"); got[0] != 0 || got[1] != 0 {
		t.Fatalf("after the confirm the offsets are %v, want 0 and 0", got)
	}
}

// A message its group's handler refuses lands in the dead-letter topic;
// an operator finds it in the browser, resends it, and the group receives
// it again.
func TestBrowserResendsADeadLetter(t *testing.T) {
	browserPath(t)
	e := startEnv(t, envOpts{auth: true, edit: unlimited})
	e.topic(t, "parcels")
	e.topic(t, "%DLQ%shipping")
	handled := e.runConsumer(t, "shipping", "parcels", "poison")
	e.send(t, &producer.Message{Topic: "parcels", Key: "k", Body: []byte("poison")})
	c := e.chrome(t, "admin")
	c.acceptDialogs()
	c.login(e.adminTok)
	dlq := e.srv.URL + Prefix + "deadletters?topic=" + url.QueryEscape("%DLQ%shipping")
	testwait.For(t, 20*time.Second, "the dead letter on the page", func() bool {
		c.do("open the dead letters", chromedp.Navigate(dlq), chromedp.WaitVisible(chromedp.CSS("h1")))
		return c.has(`#resend input[name=offset]`)
	})
	c.shot("deadletters")
	before := len(handled())
	c.do("resend it", chromedp.Click(chromedp.CSS(`#resend input[name=offset]`)),
		chromedp.Click(chromedp.CSS(`#resend button[type=submit]`)), chromedp.WaitVisible(chromedp.ID("resent")))
	c.shot("resent")
	if said := get(c, "read where it went", chromedp.Text(chromedp.ID("resent"))); !strings.Contains(said, "parcels") {
		t.Fatalf("the page after the resend says %q, want where it was stored", said)
	}
	testwait.For(t, 20*time.Second, "the group receives the resent message", func() bool {
		got := handled()
		return len(got) > before && got[len(got)-1] == "poison"
	})
}
