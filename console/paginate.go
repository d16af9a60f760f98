package console

import (
	"net/url"
	"strconv"
	"strings"
)

// Every list is paginated here, on the server: a page never holds more
// than maxPageSize rows, whatever the registry holds.
const (
	defaultPageSize = 50
	maxPageSize     = 500
)

// pager is a list's page and the links to its neighbours.
type pager struct {
	Page, Pages, Size, Total int
	First, Last              int // the rows shown, from 1 (0 when none)
	Prev, Next               string
}

// pageOf returns the rows of items the request's page and size (query
// parameters "page" from 1, "size") select, and the pager; a page past the
// end shows the last one. The filter "q", when given, keeps the rows whose
// key contains it.
func pageOf[T any](q *query, items []T, key func(T) string) ([]T, pager, error) {
	v := q.r.URL.Query()
	size, err := intParam(v, "size", defaultPageSize, 1, maxPageSize)
	if err != nil {
		return nil, pager{}, err
	}
	page, err := intParam(v, "page", 1, 1, 1<<30)
	if err != nil {
		return nil, pager{}, err
	}
	if f := v.Get("q"); f != "" {
		if len(f) > 255 {
			return nil, pager{}, bad("the filter is longer than 255 characters")
		}
		kept := items[:0:0]
		for _, it := range items {
			if strings.Contains(key(it), f) {
				kept = append(kept, it)
			}
		}
		items = kept
	}
	p := pager{Size: size, Total: len(items), Pages: max(1, (len(items)+size-1)/size)}
	p.Page = min(page, p.Pages)
	from := (p.Page - 1) * size
	to := min(from+size, len(items))
	if from < to {
		p.First, p.Last = from+1, to
	}
	if p.Page > 1 {
		p.Prev = withParam(q.r.URL, "page", strconv.Itoa(p.Page-1))
	}
	if p.Page < p.Pages {
		p.Next = withParam(q.r.URL, "page", strconv.Itoa(p.Page+1))
	}
	return items[from:to], p, nil
}

// intParam reads the integer query parameter name, def when absent; out
// of [lo, hi] or not a number is bad input.
func intParam(v url.Values, name string, def, lo, hi int) (int, error) {
	s := v.Get(name)
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		return 0, bad("%s must be a whole number from %d to %d", name, lo, hi)
	}
	return n, nil
}

// withParam is u (a console URL) with the query parameter name set to value.
func withParam(u *url.URL, name, value string) string {
	q := u.Query()
	q.Set(name, value)
	return u.Path + "?" + q.Encode()
}
