// Package console is ferrymq's web console: HTML pages served by every
// metaserver on its HTTP port (the one with /metrics), under /console/.
//
// The console is a client of the cluster like ferryctl, not a part of the
// registry: a page reads the registry through the metaserver client and
// messages from the brokers, and an action is the same request ferryctl
// makes, so the servers check it and the registry records it as they do
// any other. Who may do what is the wire's rule: a session is a principal
// of the registry's table, logged in with its token (or a TLS client
// certificate naming it), every page and action is checked with
// auth.Authorize for the request it stands for before anything is asked,
// and a token session calls the servers with the principal's own token, so
// the servers check it again. With authorization off every page is open,
// as the wire is.
//
// Bounded by construction: every list is paginated by the server, every
// search has a time and a bytes budget and returns a cursor to go on
// from, a session's requests are rate limited, and the console makes at
// most a few calls to the cluster at a time, whatever the number of
// browsers (its work waits, the brokers' does not).
//
// Safe by construction: pages are html/template (contextual escaping), a
// message body is shown as text, JSON or hex, never as HTML; forms carry a
// per-session CSRF token and a POST must come from the console's own
// origin; the session cookie is HttpOnly, SameSite=Strict, Secure over
// HTTPS; no page holds a token or a secret.
package console
