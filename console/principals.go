package console

import (
	"github.com/ferrymq/ferrymq/metaserver/api"
)

// principalsData is the principals page's: a page of the registry's
// principals with their permissions.
type principalsData struct {
	Version    uint64
	Principals []principalRow
	Pager      pager
	Filter     string
}

type principalRow struct {
	Name        string
	Permissions []string
	// Token is the first 8 hex characters of the token's SHA-256, enough
	// to tell two apart ("": none, known by certificate only); the page
	// never holds more of it.
	Token string
}

// tokenPrefix is how much of a token's hash the page shows.
const tokenPrefix = 8

func principalsPage(q *query) (any, error) {
	release, err := q.slot()
	if err != nil {
		return nil, err
	}
	acl, err := q.meta().ACL(q.ctx)
	release()
	if err != nil {
		return nil, err
	}
	shown, p, err := pageOf(q, acl.Principals, func(p api.ACLPrincipal) string { return p.Name })
	if err != nil {
		return nil, err
	}
	d := principalsData{Version: acl.Version, Pager: p, Filter: q.r.URL.Query().Get("q")}
	for _, pr := range shown {
		d.Principals = append(d.Principals, principalRow{Name: pr.Name, Permissions: pr.Permissions, Token: shortHash(pr.TokenSHA256)})
	}
	return d, nil
}

// shortHash is the first tokenPrefix characters of a hash.
func shortHash(h string) string {
	if len(h) > tokenPrefix {
		return h[:tokenPrefix]
	}
	return h
}
