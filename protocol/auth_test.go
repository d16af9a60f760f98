package protocol

import (
	"slices"
	"testing"
)

func TestAuthReplyRoundTrip(t *testing.T) {
	for _, r := range []AuthReply{{}, {Principal: "app1", Permissions: []string{"consume:orders.*:billing", "produce:orders"}}} {
		got, err := DecodeAuthReply(AppendAuthReply(nil, &r))
		if err != nil || got.Principal != r.Principal || !slices.Equal(got.Permissions, r.Permissions) {
			t.Fatalf("%+v came back as %+v, %v", r, got, err)
		}
	}
	b := AppendAuthReply(nil, &AuthReply{Principal: "x", Permissions: []string{"admin"}})
	for i := range len(b) {
		if _, err := DecodeAuthReply(b[:i]); err == nil {
			t.Fatalf("a reply cut to %d bytes decoded", i)
		}
	}
}
