package forward

import "strings"

// Template is a destination name (a Redis stream, a NATS subject, a
// Kafka topic) made of fixed text and the fields {topic} and {device},
// parsed once: naming a message costs one allocation.
type Template struct {
	parts []templatePart
	size  int // bytes of fixed text
}

type templatePart struct {
	text  string
	field byte // 0: text; 't': the topic; 'd': the device
}

// ParseTemplate parses s; def stands for an empty s. Braces other than
// the two fields are kept as text (the configuration refuses them).
func ParseTemplate(s, def string) Template {
	if s == "" {
		s = def
	}
	var t Template
	for s != "" {
		i := strings.IndexByte(s, '{')
		switch {
		case i < 0:
			i = len(s)
		case strings.HasPrefix(s[i:], "{topic}"):
			t.add(s[:i], 0)
			t.add("", 't')
			s = s[i+len("{topic}"):]
			continue
		case strings.HasPrefix(s[i:], "{device}"):
			t.add(s[:i], 0)
			t.add("", 'd')
			s = s[i+len("{device}"):]
			continue
		default:
			i++
		}
		t.add(s[:i], 0)
		s = s[i:]
	}
	return t
}

func (t *Template) add(text string, field byte) {
	if field == 0 && text == "" {
		return
	}
	if n := len(t.parts); field == 0 && n > 0 && t.parts[n-1].field == 0 {
		t.parts[n-1].text += text
	} else {
		t.parts = append(t.parts, templatePart{text, field})
	}
	t.size += len(text)
}

// Expand names a message on topic from device, writing each field
// through write (which maps what the destination's names cannot hold).
func (t Template) Expand(topic, device string, write func(b []byte, field string, topic bool) []byte) string {
	b := make([]byte, 0, t.size+len(topic)+len(device))
	for _, p := range t.parts {
		switch p.field {
		case 0:
			b = append(b, p.text...)
		case 't':
			b = write(b, topic, true)
		case 'd':
			b = write(b, device, false)
		}
	}
	return string(b)
}
