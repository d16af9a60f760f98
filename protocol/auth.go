package protocol

// AuthReply answers CodeAuth: the principal the token names and its
// permissions (auth.Permission texts). A server that checks no credentials
// (authorization off) answers an empty Principal.
//
//	principal    u16 length + bytes
//	count        u16
//	permissions  count x (u16 length + bytes)
type AuthReply struct {
	Principal   string
	Permissions []string
}

// AppendAuthReply appends r's encoding.
func AppendAuthReply(dst []byte, r *AuthReply) []byte {
	dst = appendStr16(dst, clip16(r.Principal))
	n := min(len(r.Permissions), 0xffff)
	dst = append(dst, byte(n>>8), byte(n))
	for _, p := range r.Permissions[:n] {
		dst = appendStr16(dst, clip16(p))
	}
	return dst
}

// DecodeAuthReply decodes an AUTH answer.
func DecodeAuthReply(b []byte) (AuthReply, error) {
	r := reader{b: b}
	out := AuthReply{Principal: r.str16("principal")}
	n := int(r.u16("permission count"))
	for i := 0; i < n && r.err == nil; i++ {
		out.Permissions = append(out.Permissions, r.str16("permission"))
	}
	if err := r.done("auth reply"); err != nil {
		return AuthReply{}, err
	}
	return out, nil
}
