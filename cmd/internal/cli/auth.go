package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/hashicorp/go-hclog"

	"github.com/ferrymq/ferrymq/auth"
)

// AuthFlags are the authorization flags of the servers. Authorization is
// on when -auth-cluster-token-file is given (off by default): every port
// then serves a connection only once it authenticated (AUTH with a token,
// or a TLS client certificate naming a principal) and checks each request
// against the registry's permission table.
//
//   - -auth-cluster-token-file (every server): the servers' shared secret,
//     the same on every metaserver and broker; a broker presents it to the
//     metaservers and, as a slave, to its master. It opens nothing on the
//     metaservers' raft port: their own -raft-secret-file does.
//   - -auth-admin-token-file (metaservers): the bootstrap admin's token,
//     which holds admin whatever the table says (the brokers learn its
//     hash from the metaservers).
//
// A token file holds one token of 32 to 512 printable characters (ferryctl
// acl add makes them; so does 32 random bytes in base64); the spaces and
// line ends around it are cut. A token file that others than its owner may
// read or write (mode & 077) is taken, with a warning (LogWarnings), as
// ssh does with keys.
type AuthFlags struct {
	ClusterFile, AdminFile string

	loose []LooseFile // token files read so far that others may read or write
}

// LooseFile is a token file whose mode lets others than its owner read or
// write it.
type LooseFile struct {
	Flag, Path string
	Mode       os.FileMode // the permission bits
}

// LooseFiles are the token files read so far whose mode has bits for the
// group or others.
func (f *AuthFlags) LooseFiles() []LooseFile { return f.loose }

// LogWarnings logs a WARN line for each token file read so far that others
// than its owner may read or write. Servers call it once their logger
// exists (the files are read before it).
func (f *AuthFlags) LogWarnings(lg hclog.Logger) {
	for _, l := range f.loose {
		lg.Warn("token file is accessible to others than its owner: chmod 600 it", "flag", "-"+l.Flag, "file", l.Path, "mode", fmt.Sprintf("%#o", l.Mode))
	}
}

// Register adds -auth-cluster-token-file to fs, and with admin
// -auth-admin-token-file (the metaservers').
func (f *AuthFlags) Register(fs *flag.FlagSet, admin bool) {
	fs.StringVar(&f.ClusterFile, "auth-cluster-token-file", "", "file holding the servers' shared token; given, it turns authorization on (empty: off, every peer may do anything)")
	if admin {
		fs.StringVar(&f.AdminFile, "auth-admin-token-file", "", "file holding the bootstrap admin's token, admin whatever the permission table says (needs -auth-cluster-token-file)")
	}
}

// ClusterToken reads the cluster token ("" without the flag). A file that
// cannot be read or holds no token is a ConfigError naming the flag.
func (f *AuthFlags) ClusterToken() (string, error) {
	if f.AdminFile != "" && f.ClusterFile == "" {
		return "", &ConfigError{errors.New("-auth-admin-token-file needs -auth-cluster-token-file: authorization is on only with the cluster token")}
	}
	return f.readToken("auth-cluster-token-file", f.ClusterFile)
}

// Builtins reads both files: the cluster token and the built-in
// principals' hashes (zero without the flags).
func (f *AuthFlags) Builtins() (clusterToken string, b auth.Builtins, err error) {
	if clusterToken, err = f.ClusterToken(); err != nil {
		return "", auth.Builtins{}, err
	}
	admin, err := f.readToken("auth-admin-token-file", f.AdminFile)
	if err != nil {
		return "", auth.Builtins{}, err
	}
	if admin != "" {
		b.Admin = auth.HashToken(admin)
		if admin == clusterToken {
			return "", auth.Builtins{}, &ConfigError{errors.New("-auth-admin-token-file and -auth-cluster-token-file hold the same token: give each its own")}
		}
	}
	if clusterToken != "" {
		b.Cluster = auth.HashToken(clusterToken)
	}
	return clusterToken, b, nil
}

// SecretFile reads the secret in the file of the flag flagName ("" when
// path is ""), by a token file's rules: a file that cannot be read or
// holds a weak secret is a ConfigError naming the flag, and one others may
// read is warned of (LogWarnings). The metaservers' -raft-secret-file.
func (f *AuthFlags) SecretFile(flagName, path string) (string, error) {
	return f.readToken(flagName, path)
}

func (f *AuthFlags) readToken(flagName, path string) (string, error) {
	if path == "" {
		return "", nil
	}
	raw, mode, err := ReadSecretFile(path)
	if err != nil {
		return "", &ConfigError{fmt.Errorf("-%s: %w", flagName, err)}
	}
	if mode&0o077 != 0 {
		seen := false
		for _, l := range f.loose {
			seen = seen || l.Path == path
		}
		if !seen {
			f.loose = append(f.loose, LooseFile{Flag: flagName, Path: path, Mode: mode})
		}
	}
	tok, err := auth.ParseToken(raw)
	if err != nil {
		return "", &ConfigError{fmt.Errorf("-%s %s: %w", flagName, path, err)}
	}
	return tok, nil
}

// ReadSecretFile reads a file holding a secret and returns its permission
// bits as well (of the file read: a symbolic link is followed); a caller
// warns when mode&077 != 0.
func ReadSecretFile(path string) (data []byte, mode os.FileMode, err error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer file.Close()
	st, err := file.Stat()
	if err != nil {
		return nil, 0, err
	}
	data, err = io.ReadAll(file)
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", path, err)
	}
	return data, st.Mode().Perm(), nil
}
