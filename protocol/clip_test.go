package protocol

import (
	"strings"
	"testing"
)

func TestClip(t *testing.T) {
	if got := Clip("short"); got != "short" {
		t.Fatalf("Clip(short) = %q", got)
	}
	long := strings.Repeat("é", 3000) // 2 bytes each: 64 bytes is 32 of them
	got := Clip(long)
	if want := strings.Repeat("é", 32) + "...(6000 bytes)"; got != want {
		t.Fatalf("Clip of 6000 bytes = %q, want %q", got, want)
	}
	odd := "a" + long // the 64th byte is inside a character: cut before it
	if want := "a" + strings.Repeat("é", 31) + "...(6001 bytes)"; Clip(odd) != want {
		t.Fatalf("Clip cut inside a character: %q", Clip(odd))
	}
}
