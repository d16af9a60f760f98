package console

import (
	"bytes"
	"cmp"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/ferrymq/ferrymq/auth"
)

// view is what every page's template gets.
type view struct {
	Title     string
	Path      string // the page's path under Prefix
	Principal string
	AuthOff   bool
	CSRF      string
	Nav       []navItem
	Data      any
	Error     string // an error page's message
	Status    int
}

type navItem struct {
	Path, Title string
	Current     bool
}

// loginView is the login page's.
type loginView struct {
	Next     string
	CertName string // the connection's verified client certificate's name, if any
	Error    string
}

var funcs = template.FuncMap{
	"time":  fmtTime,
	"ms":    fmtMillis,
	"bytes": fmtBytes,
	"link":  link,
	"add":   func(a, b int) int { return a + b },
	"sub":   func(a, b int64) int64 { return a - b },
}

// parseTemplates parses every page's template with the layout.
func (c *Console) parseTemplates() error {
	c.tmpl = map[string]*template.Template{}
	layout, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/parts.html")
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	names := []string{"error"}
	for _, p := range c.pages {
		names = append(names, p.tmpl)
	}
	for _, name := range names {
		if _, ok := c.tmpl[name]; ok {
			continue
		}
		t, err := template.Must(layout.Clone()).ParseFS(templateFS, "templates/"+name+".html")
		if err != nil {
			return fmt.Errorf("console: %w", err)
		}
		c.tmpl[name] = t
	}
	login, err := template.New("login.html").Funcs(funcs).ParseFS(templateFS, "templates/login.html")
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	c.tmpl["login"] = login
	return nil
}

// render writes page p with data.
func (c *Console) render(w http.ResponseWriter, s *session, status int, p *page, data any) {
	v := c.view(s, p.path, cmp.Or(p.title, p.heading))
	v.Data = data
	c.write(w, status, c.tmpl[p.tmpl], v)
}

func (c *Console) view(s *session, path, title string) view {
	v := view{Title: title, Path: path, AuthOff: !c.authOn()}
	if s != nil {
		v.Principal, v.CSRF = s.principal.Name, s.csrf
		for _, p := range c.pages {
			if p.title == "" || (p.brokers && s.byCert) {
				continue
			}
			if c.authOn() && auth.Authorize(s.principal, p.code, auth.Target{}) != nil && !anyTopic(s, p.code) {
				continue
			}
			v.Nav = append(v.Nav, navItem{Path: Prefix + p.path[1:], Title: p.title, Current: p.path == path})
		}
	}
	return v
}

// fail answers with an error page (the layout, when there is a session).
func (c *Console) fail(w http.ResponseWriter, r *http.Request, s *session, status int, err error) {
	if status >= 500 {
		c.cfg.Logger.Warn("console page failed", "path", r.URL.Path, "status", status, "error", err)
	}
	v := c.view(s, "", http.StatusText(status))
	v.Error, v.Status = err.Error(), status
	c.write(w, status, c.tmpl["error"], v)
}

func (c *Console) renderLogin(w http.ResponseWriter, status int, v loginView) {
	c.write(w, status, c.tmpl["login"], v)
}

// write executes t into a buffer first, so a template error is a 500, not
// half a page.
func (c *Console) write(w http.ResponseWriter, status int, t *template.Template, data any) {
	var buf bytes.Buffer
	if err := t.Execute(&buf, data); err != nil {
		c.cfg.Logger.Error("console template failed", "template", t.Name(), "error", err)
		http.Error(w, "the page could not be drawn", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = buf.WriteTo(w)
}

func fmtTime(t any) string {
	var tt time.Time
	switch v := t.(type) {
	case time.Time:
		tt = v
	case int64: // Unix milliseconds
		if v <= 0 {
			return "-"
		}
		tt = time.UnixMilli(v)
	default:
		return fmt.Sprint(t)
	}
	if tt.IsZero() {
		return "-"
	}
	return tt.UTC().Format("2006-01-02 15:04:05.000Z")
}

// fmtMillis shows a duration in milliseconds ("-" when negative: unknown).
func fmtMillis(ms int64) string {
	if ms < 0 {
		return "-"
	}
	return (time.Duration(ms) * time.Millisecond).String()
}

func fmtBytes(n int64) string {
	switch {
	case n < 0:
		return "-"
	case n < 1<<10:
		return strconv.FormatInt(n, 10) + " B"
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	case n < 1<<30:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	}
}

// link is a console URL: path under Prefix with the query pairs given as
// key, value, key, value...
func link(path string, kv ...any) string {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(fmt.Sprint(kv[i]), fmt.Sprint(kv[i+1]))
	}
	u := Prefix + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u
}
