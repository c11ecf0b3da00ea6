// Package interop holds the tests that run real MQTT clients other than
// the Go ones the gateway's own tests use (MQTT.js under node, Python
// paho, paho.golang as a separate program) against a gateway started in
// the test: the docs' device examples (docs/device-feedback.md, "Device
// examples") are extracted from the page and run as they are, and what
// they print is checked against the admin API. The tools come from
// scripts/ensure-tools.sh; a missing one fails the tests, never skips
// them.
package interop
