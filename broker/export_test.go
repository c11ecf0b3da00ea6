package broker

// publishInline publishes as the server itself (mochi's inline client),
// the way deferred messages will be released.
func (s *Server) publishInline(topic string, payload []byte, qos byte) error {
	return s.mqtt.Publish(topic, payload, false, qos)
}
