package console

import (
	"errors"
	"net/url"
	"sort"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// groupsData is the broker groups page's: every group (a page of them), or
// the one asked for with ?group=.
type groupsData struct {
	Groups []groupView
	Pager  pager
	Filter string
	One    bool // ?group= named one: it is shown alone
	// MayChange: the principal may mark a group read-only or writable.
	MayChange bool
	CSRF      string
	Charts    []chart // the groups' bytes stored a second
}

// groupView is one broker group with what its template shows besides the
// registry's answer.
type groupView struct {
	api.GroupInfo
	MinInSync int // the group's, or the default when it sets none
	Slaves    []api.BrokerStatus
	// AdminMarked: an admin marked the group read-only (the form offers
	// to clear it; otherwise to set it).
	AdminMarked bool
}

func newGroupView(g api.GroupInfo) groupView {
	v := groupView{GroupInfo: g, MinInSync: g.Group.MinInSync, AdminMarked: g.Reasons&routing.Admin != 0}
	if v.MinInSync == 0 {
		v.MinInSync = routing.DefaultMinInSync
	}
	for _, m := range g.Members {
		if m.Role == string(routing.RoleSlave) {
			v.Slaves = append(v.Slaves, m)
		}
	}
	return v
}

// brokerGroupParam reads a broker group's name from the query or form
// field name ("" when absent), checked as brokers check it.
func brokerGroupParam(v url.Values, name string) (string, error) {
	g := v.Get(name)
	if g == "" {
		return "", nil
	}
	if err := protocol.ValidateServerName("broker group name", g); err != nil {
		return "", bad("%v", err)
	}
	return g, nil
}

func groupsPage(q *query) (any, error) {
	one, err := brokerGroupParam(q.r.URL.Query(), "group")
	if err != nil {
		return nil, err
	}
	release, err := q.slot()
	if err != nil {
		return nil, err
	}
	groups, err := q.meta().Groups(q.ctx)
	release()
	if err != nil {
		return nil, err
	}
	sort.Slice(groups, func(i, j int) bool { return groups[i].Name < groups[j].Name })
	d := groupsData{One: one != "", CSRF: q.s.csrf, Filter: q.r.URL.Query().Get("q"),
		MayChange: q.allow(protocol.CodeAdminSetGroupMode, auth.Target{}) == nil}
	if one != "" {
		for _, g := range groups {
			if g.Name == one {
				d.Groups = []groupView{newGroupView(g)}
			}
		}
		if d.Groups == nil {
			return nil, bad("no broker group %q", one)
		}
	} else {
		shown, p, err := pageOf(q, groups, func(g api.GroupInfo) string { return g.Name })
		if err != nil {
			return nil, err
		}
		d.Pager = p
		for _, g := range shown {
			d.Groups = append(d.Groups, newGroupView(g))
		}
	}
	names := make([]string, len(d.Groups))
	for i, g := range d.Groups {
		names[i] = g.Name
	}
	d.Charts = q.groupCharts(names)
	return d, nil
}

// setGroupMode is the broker groups page's form: mark a group read-only
// (it stays so until marked writable) or clear that mark, as 'ferryctl
// broker readonly|writable' does.
func setGroupMode(q *query) (string, error) {
	if err := q.allow(protocol.CodeAdminSetGroupMode, auth.Target{}); err != nil {
		return "", err
	}
	g, err := brokerGroupParam(q.r.PostForm, "group")
	if err != nil {
		return "", err
	}
	if g == "" {
		return "", bad("say which group")
	}
	var readOnly bool
	switch q.r.PostForm.Get("mode") {
	case "readonly":
		readOnly = true
	case "writable":
	default:
		return "", bad("mode must be readonly or writable")
	}
	release, err := q.slot()
	if err != nil {
		return "", err
	}
	defer release()
	if _, err := q.meta().SetGroupReadOnly(q.ctx, g, readOnly); err != nil {
		return "", unknownIsBad(err)
	}
	return link("groups", "group", g), nil
}

// unknownIsBad makes the registry's NOT_FOUND (a group or topic named in
// the request that does not exist) a 400 naming it, as any other name the
// browser got wrong; other errors pass unchanged.
func unknownIsBad(err error) error {
	if errors.Is(err, protocol.ErrNotFound) || errors.Is(err, protocol.ErrUnknownTopic) {
		return bad("%v", err)
	}
	return err
}
