package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
)

// ferryctl acl: the permission table in the registry (admin only). A
// principal's token is made here (auth.NewToken), printed once, and only
// its SHA-256 is sent. grant, revoke and rotate read the principal and
// write it back at the ACL version they read (expect_version), so that a
// change made meanwhile is not undone: they fail with CONFLICT instead.

func newACLCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{Use: "acl", Short: "Manage principals and their permissions (admin)",
		Long: `Manage principals and their permissions (admin; needs authorization on).

A permission is one of: admin, cluster, describe, produce:<topic-pattern>,
consume:<topic-pattern>:<group-pattern>. A pattern is a name, a prefix ending
in '*', or '*'.`}
	cmd.AddCommand(newACLAddCommand(g), newACLPermCommand(g, "grant"), newACLPermCommand(g, "revoke"),
		newACLRemoveCommand(g), newACLListCommand(g), newACLRotateCommand(g))
	return cmd
}

// addPermFlag defines --perm on cmd, each value checked as a permission.
func addPermFlag(g *globalOptions, cmd *cobra.Command, perms *[]string, usage string) {
	cmd.Flags().StringArrayVar(perms, "perm", nil, usage)
	g.checker(cmd.Flags()).name("perm", "a permission: admin, cluster, describe, produce:T or consume:T:G", func(s string) error {
		_, err := auth.ParsePermission(s)
		return err
	})
}

// tokenResult is what add and rotate print: the token, once.
type tokenResult struct {
	Name        string   `json:"name"`
	Token       string   `json:"token"`
	Permissions []string `json:"permissions"`
	Version     uint64   `json:"acl_version"`
}

func printToken(g *globalOptions, r tokenResult) error {
	return g.printer().print(r, []string{"PRINCIPAL", "TOKEN (shown once: keep it)", "PERMISSIONS", "ACL VERSION"},
		[][]string{{r.Name, r.Token, strings.Join(r.Permissions, ","), fmt.Sprint(r.Version)}})
}

// principalArg checks a command's NAME argument before any network call.
func principalArg(cmd *cobra.Command, args []string) error {
	if len(args) == 1 {
		if err := auth.ValidateName(args[0]); err != nil {
			return err
		}
	}
	return nil
}

// findPrincipal reads the ACL and the principal named name.
func findPrincipal(ctx context.Context, cl *client.Client, name string) (api.ACL, *api.ACLPrincipal, error) {
	acl, err := cl.ACL(ctx)
	if err != nil {
		return acl, nil, err
	}
	for i := range acl.Principals {
		if acl.Principals[i].Name == name {
			return acl, &acl.Principals[i], nil
		}
	}
	return acl, nil, nil
}

// setPrincipal is the read-modify-write of acl add, grant, revoke and
// rotate: it reads the ACL and the principal named name, refuses one that
// exists (isNew: add) or one that does not (the others), and sets the token
// hash and permissions edit makes of it (nil for add) at the ACL version it
// read.
func setPrincipal(ctx context.Context, cl *client.Client, name string, isNew bool,
	edit func(p *api.ACLPrincipal) (tokenSHA256 string, perms []string, err error)) (api.ACLChangeReply, error) {
	acl, p, err := findPrincipal(ctx, cl, name)
	if err != nil {
		return api.ACLChangeReply{}, err
	}
	if isNew && p != nil {
		return api.ACLChangeReply{}, fmt.Errorf("principal %q already exists (ferryctl acl grant, revoke or rotate change it)", name)
	}
	if !isNew && p == nil {
		return api.ACLChangeReply{}, fmt.Errorf("principal %q does not exist (ferryctl acl add makes one)", name)
	}
	tokenSHA256, perms, err := edit(p)
	if err != nil {
		return api.ACLChangeReply{}, err
	}
	return cl.SetPrincipal(ctx, api.ACLSetRequest{Name: name, TokenSHA256: tokenSHA256, Permissions: perms,
		ExpectVersion: acl.Version})
}

func newACLAddCommand(g *globalOptions) *cobra.Command {
	var perms []string
	cmd := &cobra.Command{
		Use:   "add NAME --perm P [--perm P]...",
		Short: "Create a principal with a new token (printed once) and its permissions",
		Args:  usageArgs(cobra.MatchAll(cobra.ExactArgs(1), principalArg)),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			name := args[0]
			var tok string
			res, err := setPrincipal(ctx, cl, name, true, func(*api.ACLPrincipal) (string, []string, error) {
				tok = auth.NewToken()
				return auth.HashToken(tok).String(), perms, nil
			})
			if err != nil {
				return err
			}
			canon, _ := auth.ParsePermissions(perms)
			return printToken(g, tokenResult{Name: name, Token: tok, Permissions: auth.Strings(canon), Version: res.Version})
		}),
	}
	addPermFlag(g, cmd, &perms, "a permission to give (repeat it for more; none: a principal that may do nothing yet)")
	return cmd
}

// newACLPermCommand is grant (add permissions) or revoke (take them away).
func newACLPermCommand(g *globalOptions, verb string) *cobra.Command {
	var perms []string
	short := "Give a principal more permissions"
	if verb == "revoke" {
		short = "Take permissions from a principal"
	}
	cmd := &cobra.Command{
		Use:   verb + " NAME --perm P [--perm P]...",
		Short: short,
		Args:  usageArgs(cobra.MatchAll(cobra.ExactArgs(1), principalArg)),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			if len(perms) == 0 {
				return usageError{errors.New("--perm is required: the permissions to " + verb)}
			}
			name := args[0]
			var tokenSHA256 string
			var next []string
			res, err := setPrincipal(ctx, cl, name, false, func(p *api.ACLPrincipal) (string, []string, error) {
				given, err := auth.ParsePermissions(perms)
				if err != nil {
					return "", nil, usageError{err}
				}
				tokenSHA256, next = p.TokenSHA256, slices.Clone(p.Permissions)
				for _, q := range auth.Strings(given) {
					if verb == "grant" {
						next = append(next, q)
					} else {
						next = slices.DeleteFunc(next, func(s string) bool { return s == q })
					}
				}
				return tokenSHA256, next, nil
			})
			if err != nil {
				return err
			}
			canon, _ := auth.ParsePermissions(next)
			return printPrincipals(g, api.ACL{Version: res.Version, Principals: []api.ACLPrincipal{{Name: name,
				TokenSHA256: tokenSHA256, Permissions: auth.Strings(canon)}}})
		}),
	}
	addPermFlag(g, cmd, &perms, "a permission to "+verb+" (repeat it for more)")
	return cmd
}

func newACLRemoveCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME",
		Short: "Remove a principal: its token and certificate name are refused by the metaservers from the next request on, by the brokers within about a heartbeat",
		Args:  usageArgs(cobra.MatchAll(cobra.ExactArgs(1), principalArg)),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			res, err := cl.RemovePrincipal(ctx, api.ACLRemoveRequest{Name: args[0]})
			if err != nil {
				return err
			}
			if !res.Changed {
				return fmt.Errorf("principal %q does not exist", args[0])
			}
			return g.printer().print(res, []string{"REMOVED", "ACL VERSION"}, [][]string{{args[0], fmt.Sprint(res.Version)}})
		}),
	}
}

func printPrincipals(g *globalOptions, acl api.ACL) error {
	var rows [][]string
	for _, p := range acl.Principals {
		tok := "yes"
		if p.TokenSHA256 == "" {
			tok = "no (certificate only)"
		}
		perms := strings.Join(p.Permissions, ",")
		if perms == "" {
			perms = "-"
		}
		rows = append(rows, []string{p.Name, perms, tok, fmt.Sprint(acl.Version)})
	}
	return g.printer().print(acl, []string{"PRINCIPAL", "PERMISSIONS", "TOKEN", "ACL VERSION"}, rows)
}

func newACLListCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the principals and their permissions (the built-in admin and cluster are not listed)",
		Args:  usageArgs(cobra.NoArgs),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			acl, err := cl.ACL(ctx)
			if err != nil {
				return err
			}
			return printPrincipals(g, acl)
		}),
	}
}

func newACLRotateCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "rotate NAME",
		Short: "Give a principal a new token (printed once); the old one is refused by the metaservers from the next request on, by the brokers within about a heartbeat",
		Args:  usageArgs(cobra.MatchAll(cobra.ExactArgs(1), principalArg)),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			name := args[0]
			var tok string
			var perms []string
			res, err := setPrincipal(ctx, cl, name, false, func(p *api.ACLPrincipal) (string, []string, error) {
				tok, perms = auth.NewToken(), p.Permissions
				return auth.HashToken(tok).String(), perms, nil
			})
			if err != nil {
				return err
			}
			return printToken(g, tokenResult{Name: name, Token: tok, Permissions: perms, Version: res.Version})
		}),
	}
}
