package broker

// publishInline publishes as the server itself (mochi's inline client),
// the way deferred messages will be released.
func (s *Server) publishInline(topic string, payload []byte, qos byte) error {
	return s.mqtt.Publish(topic, payload, false, qos)
}

// connCount returns the number of cached connections.
func (h *throttle) connCount() int {
	n := 0
	h.conns.Range(func(any, any) bool { n++; return true })
	return n
}

// open returns the number of connections the listener tracks.
func (l *tcpListener) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}
