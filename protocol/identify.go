package protocol

// Server kinds an Identity names.
const (
	KindBroker     = "broker"
	KindMetaserver = "metaserver"
)

// Identity answers CodeIdentify: what kind of server answered and which one
// it is.
//
//	kind   u16 length + bytes: KindBroker or KindMetaserver
//	id     u16 length + bytes: the server's id (a broker's -id)
//	group  u16 length + bytes: a broker's group ("" otherwise)
//	role   u16 length + bytes: a broker's role now, master or slave ("" otherwise)
type Identity struct {
	Kind  string
	ID    string
	Group string
	Role  string
}

// AppendIdentity appends id's encoding.
func AppendIdentity(dst []byte, id *Identity) []byte {
	dst = appendStr16(dst, clip16(id.Kind))
	dst = appendStr16(dst, clip16(id.ID))
	dst = appendStr16(dst, clip16(id.Group))
	return appendStr16(dst, clip16(id.Role))
}

// DecodeIdentity decodes an IDENTIFY answer.
func DecodeIdentity(b []byte) (Identity, error) {
	r := reader{b: b}
	id := Identity{Kind: r.str16("kind"), ID: r.str16("id"), Group: r.str16("group"), Role: r.str16("role")}
	if err := r.done("identity"); err != nil {
		return Identity{}, err
	}
	return id, nil
}
