package tlsconf_test

import (
	"fmt"

	"github.com/ferrymq/ferrymq/tlsconf"
)

// An application builds the SDKs' TLS config from the cluster's CA and its
// own certificate (empty names: the system's roots, no client certificate).
func ExampleClientConfig() {
	cfg, err := tlsconf.ClientConfig("", "", "")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(cfg.MinVersion == tlsconf.MinVersion)
	// Output: true
}
