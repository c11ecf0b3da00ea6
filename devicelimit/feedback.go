package devicelimit

import (
	"fmt"
	"strconv"
	"strings"
)

// FeedbackMode says when a device's acknowledgements carry its standing
// (docs/device-feedback.md).
type FeedbackMode uint8

// The feedback modes. The zero value, FeedbackDefault, is a quota that
// does not say: DefaultFeedback applies.
const (
	FeedbackDefault FeedbackMode = iota
	// FeedbackOff sends nothing: no RateLimit-Policy, no RateLimit.
	FeedbackOff
	// FeedbackRefusals sends RateLimit on refusals only.
	FeedbackRefusals
	// FeedbackAlways sends RateLimit on every acknowledgement.
	FeedbackAlways
	// FeedbackBelow sends RateLimit on refusals and when some window
	// that bounds the message has less than Feedback.Below % left.
	FeedbackBelow
)

// Feedback is a quota's feedback setting: a mode and, for FeedbackBelow,
// the share in percent (1 to 100). A value; the zero value is
// DefaultFeedback's stand-in.
type Feedback struct {
	Mode  FeedbackMode
	Below uint8
}

// DefaultFeedback is the feedback of a quota that does not set one:
// RateLimit on refusals and once a window has less than a quarter left.
var DefaultFeedback = Feedback{Mode: FeedbackBelow, Below: 25}

// Effective returns f, or DefaultFeedback when f does not say.
func (f Feedback) Effective() Feedback {
	if f.Mode == FeedbackDefault {
		return DefaultFeedback
	}
	return f
}

// On reports whether f sends anything at all (CONNACK's
// RateLimit-Policy included).
func (f Feedback) On() bool { return f.Effective().Mode != FeedbackOff }

// Looks reports whether an acknowledgement under f may carry RateLimit,
// before the standing is known: refused says the message was refused
// (or would have been, in shadow mode). Only then need the standing be
// read, and Wants asked.
func (f Feedback) Looks(refused bool) bool {
	switch f.Effective().Mode {
	case FeedbackAlways, FeedbackBelow:
		return true
	case FeedbackRefusals:
		return refused
	}
	return false
}

// Wants reports whether an acknowledgement under f with standing s
// carries RateLimit; refused as for Looks.
func (f Feedback) Wants(refused bool, s *Standing) bool {
	switch f = f.Effective(); f.Mode {
	case FeedbackAlways:
		return true
	case FeedbackRefusals:
		return refused
	case FeedbackBelow:
		return refused || s.Below(int(f.Below))
	}
	return false
}

// String returns f in the configuration's terms: "off", "refusals",
// "always", "below 25%", "" for FeedbackDefault.
func (f Feedback) String() string {
	switch f.Mode {
	case FeedbackOff:
		return "off"
	case FeedbackRefusals:
		return "refusals"
	case FeedbackAlways:
		return "always"
	case FeedbackBelow:
		return "below " + strconv.Itoa(int(f.Below)) + "%"
	}
	return ""
}

// ParseFeedbackMode returns the feedback of a mode named s: off,
// refusals or always.
func ParseFeedbackMode(s string) (Feedback, error) {
	switch s {
	case "off":
		return Feedback{Mode: FeedbackOff}, nil
	case "refusals":
		return Feedback{Mode: FeedbackRefusals}, nil
	case "always":
		return Feedback{Mode: FeedbackAlways}, nil
	}
	return Feedback{}, fmt.Errorf("%w: must be off, refusals, always or {below: N%%} (got %q)", ErrInvalidQuota, s)
}

// ParseFeedbackBelow returns the feedback "below s", s a share of 1% to
// 100% ("25%"; the % sign may be left out).
func ParseFeedbackBelow(s string) (Feedback, error) {
	n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(s), "%"))
	if err != nil || n < 1 || n > 100 {
		return Feedback{}, fmt.Errorf("%w: below must be a share between 1%% and 100%% (got %q)", ErrInvalidQuota, s)
	}
	return Feedback{Mode: FeedbackBelow, Below: uint8(n)}, nil
}

// ParseFeedback reads the text form String writes: off, refusals,
// always or "below N%".
func ParseFeedback(s string) (Feedback, error) {
	if rest, ok := strings.CutPrefix(s, "below "); ok {
		return ParseFeedbackBelow(rest)
	}
	return ParseFeedbackMode(s)
}

// validate checks f: a known mode, and a share of 1 to 100 for
// FeedbackBelow only.
func (f Feedback) validate() error {
	bad := func(msg string) error { return &FieldError{Field: "feedback", Msg: msg, Err: ErrInvalidQuota} }
	switch {
	case f.Mode > FeedbackBelow:
		return bad(fmt.Sprintf("unknown mode %d", f.Mode))
	case f.Mode == FeedbackBelow && (f.Below < 1 || f.Below > 100):
		return bad(fmt.Sprintf("below must be a share between 1%% and 100%% (got %d%%)", f.Below))
	case f.Mode != FeedbackBelow && f.Below != 0:
		return bad(fmt.Sprintf("a share (%d%%) is for below only (mode %s)", f.Below, f))
	}
	return nil
}
