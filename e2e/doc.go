// Package tests holds the end-to-end tests that run ferrymq as a user does:
// real processes started by scripts/cluster.sh.
package e2e
