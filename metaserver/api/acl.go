package api

// ACLSetRequest creates or replaces a principal (ADMIN_ACL_SET). The
// registry keeps the SHA-256 of its token, never the token.
type ACLSetRequest struct {
	Name string `json:"name"`
	// TokenSHA256 is the token's SHA-256 in hex ("": none, a principal
	// known by its TLS client certificate's name only).
	TokenSHA256 string   `json:"token_sha256"`
	Permissions []string `json:"permissions"`
	// ExpectVersion, when not 0, must be the ACL's version (else
	// CONFLICT): a read-modify-write undoes no change made meanwhile.
	ExpectVersion uint64 `json:"expect_version,omitempty"`
}

// ACLRemoveRequest removes a principal (ADMIN_ACL_REMOVE); an absent one
// changes nothing.
type ACLRemoveRequest struct {
	Name          string `json:"name"`
	ExpectVersion uint64 `json:"expect_version,omitempty"`
}

// ACLChangeReply answers ADMIN_ACL_SET and ADMIN_ACL_REMOVE.
type ACLChangeReply struct {
	// Changed is false when there was nothing to do.
	Changed bool `json:"changed"`
	// Version is the ACL's version after the change.
	Version uint64 `json:"version"`
}

// ACLPrincipal is a principal as the registry holds it.
type ACLPrincipal struct {
	Name        string   `json:"name"`
	TokenSHA256 string   `json:"token_sha256,omitempty"`
	Permissions []string `json:"permissions"`
}

// ACL answers ADMIN_ACL_LIST and ACL_GET: the registry's principals, sorted
// by name, at an ACL version (the built-in admin and cluster are never in
// it: each server has them from its own files).
type ACL struct {
	Version    uint64         `json:"version"`
	Principals []ACLPrincipal `json:"principals"`
	// AdminSHA256 is, in ACL_GET's answer only, the hash of the answering
	// node's bootstrap admin token ("": none), so that brokers let the
	// bootstrap admin in without a file of their own.
	AdminSHA256 string `json:"admin_sha256,omitempty"`
}
