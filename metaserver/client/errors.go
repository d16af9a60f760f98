package client

import (
	"unicode/utf8"

	"github.com/ferrymq/ferrymq/protocol"
)

// Name rules the client checks before a name is sent in a JSON request:
// only that it is UTF-8 (the metaserver checks the rest). JSON would carry
// other bytes as U+FFFD, and the metaserver's error would then name a
// character the user never typed.
const (
	topicName    = "topic"
	producerName = "producer"
	groupName    = "consumer group"
	memberName   = "member"
)

// checkUTF8 returns INVALID, saying where, when a name is not UTF-8.
func checkUTF8(what, name string) error {
	if utf8.ValidString(name) {
		return nil
	}
	extra := "._-"
	if what == topicName {
		extra = protocol.TopicNameChars
	}
	return &protocol.Error{Status: protocol.StatusInvalid, Message: protocol.ValidateName(what, name, 255, extra).Error()}
}
