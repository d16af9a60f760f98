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
// it: each server has them from its own files). ADMIN_ACL_LIST (admin)
// gives each principal's token hash; ACL_GET (cluster: the brokers' copy)
// gives none, only which of the hashes it was asked about are whose
// (Tokens, AdminSHA256).
type ACL struct {
	Version    uint64         `json:"version"`
	Principals []ACLPrincipal `json:"principals"`
	// Tokens is, in ACL_GET's answer only, the principal's name for each
	// hash asked (ACLGetRequest) that is a registry principal's token.
	Tokens map[string]string `json:"tokens,omitempty"`
	// AdminSHA256 is, in ACL_GET's answer only, the answering node's
	// bootstrap admin token's hash when it was one of the hashes asked
	// ("" otherwise), so that brokers let the bootstrap admin in without a
	// file of their own.
	AdminSHA256 string `json:"admin_sha256,omitempty"`
}

// ACLGetRequest asks for the ACL (ACL_GET) and whose the tokens are that
// a broker was presented: their SHA-256s in hex, at most MaxACLGetTokens.
type ACLGetRequest struct {
	TokenSHA256 []string `json:"token_sha256,omitempty"`
}

// MaxACLGetTokens is the most token hashes one ACL_GET may ask about.
const MaxACLGetTokens = 10000
