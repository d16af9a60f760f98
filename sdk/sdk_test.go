package sdk_test

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/consumer"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/sdk"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// One option list of package sdk serves both SDKs, and each SDK's own
// options are refused by the other's New (at compile time: they are not of
// its Opt type).
func TestOptionsSharedAndSealed(t *testing.T) {
	shared := []sdk.Opt{sdk.MetaAddrs("127.0.0.1:1"), sdk.TLS(nil), sdk.Token("t"), sdk.Logger(nil), sdk.Metrics(nil)}
	for _, o := range shared {
		if _, ok := any(o).(producer.Opt); !ok {
			t.Errorf("%T is not a producer option", o)
		}
		if _, ok := any(o).(consumer.Opt); !ok {
			t.Errorf("%T is not a consumer option", o)
		}
	}
	if _, ok := any(consumer.Session(time.Second)).(producer.Opt); ok {
		t.Error("a consumer option is a producer option")
	}
	if _, ok := any(producer.Linger(0)).(consumer.Opt); ok {
		t.Error("a producer option is a consumer option")
	}
	p, err := producer.New(shared[0], shared[2], shared[3], shared[4], producer.Linger(0))
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Close()
	c, err := consumer.New("g", []string{"t"}, shared[0], shared[2], consumer.Session(time.Second), consumer.Heartbeat(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	if _, err := producer.New(sdk.MetaAddrs("")); err == nil || !strings.Contains(err.Error(), "producer: MetaAddrs has an empty address") {
		t.Errorf("producer.New with an empty address: %v", err)
	}
	if _, err := consumer.New("g", []string{"t"}); err == nil || !strings.Contains(err.Error(), "consumer: MetaAddrs is required") {
		t.Errorf("consumer.New without MetaAddrs: %v", err)
	}
}
