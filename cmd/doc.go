// Package cmd holds ferrymq's programs, one directory each: ferry-metaserver
// and ferry-broker (thin server mains) and ferryctl (the admin CLI and load
// generator). Nothing imports them.
package cmd
