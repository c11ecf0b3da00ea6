package fleet

import (
	"crypto/tls"
	"flag"
	"os"
	"strings"

	"github.com/devicegate/devicegate/auth"
	"github.com/devicegate/devicegate/simulator"
)

// Environment variables that hold the simulator's passwords, so that a
// password is never on the command line (where ps shows it).
const (
	SimPasswordEnv    = "GATEWAY_SIM_PASSWORD"
	SimSubPasswordEnv = "GATEWAY_SIM_SUB_PASSWORD"
)

// maxMQTTPassword is the most an MQTT CONNECT can carry.
const maxMQTTPassword = 65535

// simAuthFlags are the simulate flags for a gateway with
// authentication on.
type simAuthFlags struct {
	username        string
	passwordFile    string
	subUsername     string
	subPasswordFile string
	subClientID     string
	tlsCA           string
}

func (a *simAuthFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.username, "username", "", "MQTT `username` of every device (and of the subscriber without --sub-username); needs --password-file or $"+SimPasswordEnv)
	fs.StringVar(&a.passwordFile, "password-file", "", "read the devices' password from the first and only line of `file` (default $"+SimPasswordEnv+")")
	fs.StringVar(&a.subUsername, "sub-username", "", "MQTT `username` of the subscriber, a consumer account (with authentication on, a device account may not subscribe to the fleet's topics); needs --sub-password-file or $"+SimSubPasswordEnv)
	fs.StringVar(&a.subPasswordFile, "sub-password-file", "", "read the subscriber's password from the first and only line of `file` (default $"+SimSubPasswordEnv+")")
	fs.StringVar(&a.subClientID, "sub-client-id", "", "client `ID` of the subscriber (default: its username when it has one, else simulator-sub- and a random suffix)")
	fs.StringVar(&a.tlsCA, "tls-ca", "", "with --addr: connect over TLS, trusting the gateway certificate's CA in this PEM `file`")
}

// subscriberIDs returns globs of the client IDs the subscriber may have
// (see --sub-client-id).
func (a *simAuthFlags) subscriberIDs() []string {
	ids := []string{"simulator-sub-*"}
	for _, id := range []string{a.subClientID, a.subUsername, a.username} {
		if id != "" {
			ids = append(ids, auth.EscapeGlob(id))
		}
	}
	return ids
}

// apply checks the flags and fills cfg.Auth, reading the password
// files and the environment.
func (a *simAuthFlags) apply(cfg *simulator.Config, set map[string]bool, own bool) error {
	password, err := simPassword("password-file", a.passwordFile, "username", a.username, SimPasswordEnv)
	if err != nil {
		return err
	}
	subPassword, err := simPassword("sub-password-file", a.subPasswordFile, "sub-username", a.subUsername, SimSubPasswordEnv)
	if err != nil {
		return err
	}
	switch {
	case set["username"] && a.username == "":
		return usagef("simulate: --username: must not be empty")
	case set["sub-username"] && a.subUsername == "":
		return usagef("simulate: --sub-username: must not be empty")
	case set["sub-client-id"] && a.subClientID == "":
		return usagef("simulate: --sub-client-id: must not be empty")
	case a.tlsCA != "" && own:
		return usagef("simulate: --tls-ca: only with --addr; an embedded or spawned gateway is reached on its plain TCP listener")
	}
	cfg.Auth = simulator.Auth{Username: a.username, Password: password, SubUsername: a.subUsername,
		SubPassword: subPassword, SubClientID: a.subClientID}
	if a.tlsCA != "" {
		pool, err := auth.LoadCAPool(a.tlsCA)
		if err != nil {
			return usagef("simulate: --tls-ca: %v", err)
		}
		cfg.Auth.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return nil
}

// simPassword returns the password for user: from file when given, else
// from the environment variable env. Both are refused without a user,
// and a user needs one of them.
func simPassword(fileFlag, file, userFlag, user, env string) (string, error) {
	if file == "" {
		pw := os.Getenv(env)
		if user == "" {
			return "", nil // an unused $env is not an error: it may be set for other runs
		}
		if pw == "" {
			return "", usagef("simulate: --%s: needs --%s or $%s (a password is never taken on the command line)", userFlag, fileFlag, env)
		}
		return pw, checkPassword("$"+env, pw)
	}
	if user == "" {
		return "", usagef("simulate: --%s: only with --%s", fileFlag, userFlag)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", usagef("simulate: --%s: %v", fileFlag, err)
	}
	pw := strings.TrimSuffix(string(b), "\n")
	pw = strings.TrimSuffix(pw, "\r")
	if strings.ContainsAny(pw, "\r\n") {
		return "", usagef("simulate: --%s: %s has more than one line; it must hold the password alone", fileFlag, file)
	}
	return pw, checkPassword("--"+fileFlag, pw)
}

// checkPassword refuses passwords no gateway account can have.
func checkPassword(from, pw string) error {
	switch {
	case pw == "":
		return usagef("simulate: %s: the password is empty", from)
	case len(pw) > maxMQTTPassword:
		return usagef("simulate: %s: the password is longer than the %d bytes an MQTT CONNECT can carry", from, maxMQTTPassword)
	}
	return nil
}
