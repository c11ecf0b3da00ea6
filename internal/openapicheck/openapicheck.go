// Package openapicheck checks an HTTP answer against the OpenAPI 3
// document that describes it: the status is documented for the
// operation, and a JSON body has the documented shape. It reads the
// subset of JSON Schema the gateway's admin/openapi.json uses (type,
// nullable, required, properties, additionalProperties, items, enum,
// minimum, maximum, minLength, maxLength, minItems, maxItems, format
// date-time, and local $ref), and it is strict where the standard is
// lenient: an object's field that its schema does not name is an error
// unless additionalProperties allows it, so a field added to an answer
// and not to the document is found.
package openapicheck

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Doc is a parsed OpenAPI document.
type Doc struct {
	root map[string]any
}

// Parse parses an OpenAPI 3 document in JSON.
func Parse(b []byte) (*Doc, error) {
	var root map[string]any
	if err := json.Unmarshal(b, &root); err != nil {
		return nil, fmt.Errorf("openapi: %w", err)
	}
	if _, ok := root["paths"].(map[string]any); !ok {
		return nil, fmt.Errorf("openapi: no paths")
	}
	return &Doc{root: root}, nil
}

// Check checks an answer of the operation method on the path template
// (as the document writes it, "/api/v1/devices/{id}"): its status must
// be documented, and, when the documented answer is JSON, body must
// match its schema. The error lists every mismatch.
func (d *Doc) Check(method, path string, status int, contentType string, body []byte) error {
	op, ok := d.at("paths", path, strings.ToLower(method)).(map[string]any)
	if !ok {
		return fmt.Errorf("%s %s: not documented", method, path)
	}
	resp, ok := d.resolve(op["responses"].(map[string]any)[strconv.Itoa(status)]).(map[string]any)
	if !ok {
		return fmt.Errorf("%s %s: status %d not documented", method, path, status)
	}
	content, _ := resp["content"].(map[string]any)
	if len(content) == 0 {
		return nil
	}
	media, _, _ := strings.Cut(contentType, ";")
	media = strings.TrimSpace(media)
	m, ok := content[media].(map[string]any)
	if !ok {
		return fmt.Errorf("%s %s %d: content type %q not documented", method, path, status, contentType)
	}
	schema, ok := m["schema"]
	if !ok || media != "application/json" {
		return nil
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("%s %s %d: body is not JSON: %v", method, path, status, err)
	}
	var errs []string
	d.validate(schema, v, "$", &errs)
	if len(errs) > 0 {
		return fmt.Errorf("%s %s %d:\n  %s", method, path, status, strings.Join(errs, "\n  "))
	}
	return nil
}

// at walks the document by keys; nil when a key is missing.
func (d *Doc) at(keys ...string) any {
	var cur any = d.root
	for _, k := range keys {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[k]
	}
	return cur
}

// resolve follows a local $ref ("#/components/..."), repeatedly.
func (d *Doc) resolve(v any) any {
	for range 16 {
		m, ok := v.(map[string]any)
		if !ok {
			return v
		}
		ref, ok := m["$ref"].(string)
		if !ok {
			return v
		}
		v = d.at(strings.Split(strings.TrimPrefix(ref, "#/"), "/")...)
	}
	return v
}

// validate checks v against schema s, adding what is wrong at path.
func (d *Doc) validate(s any, v any, path string, errs *[]string) {
	schema, ok := d.resolve(s).(map[string]any)
	if !ok {
		*errs = append(*errs, path+": schema not found")
		return
	}
	fail := func(format string, a ...any) { *errs = append(*errs, path+": "+fmt.Sprintf(format, a...)) }
	if v == nil {
		if n, _ := schema["nullable"].(bool); !n {
			fail("null, and the schema is not nullable")
		}
		return
	}
	if enum, ok := schema["enum"].([]any); ok && !slices.Contains(enum, v) {
		fail("%v is not one of %v", v, enum)
	}
	switch t, _ := schema["type"].(string); t {
	case "object":
		obj, ok := v.(map[string]any)
		if !ok {
			fail("%T, want an object", v)
			return
		}
		d.object(schema, obj, path, errs)
	case "array":
		arr, ok := v.([]any)
		if !ok {
			fail("%T, want an array", v)
			return
		}
		if n, ok := schema["minItems"].(float64); ok && float64(len(arr)) < n {
			fail("%d items, want at least %v", len(arr), n)
		}
		if n, ok := schema["maxItems"].(float64); ok && float64(len(arr)) > n {
			fail("%d items, want at most %v", len(arr), n)
		}
		for i, item := range arr {
			d.validate(schema["items"], item, fmt.Sprintf("%s[%d]", path, i), errs)
		}
	case "string":
		str, ok := v.(string)
		if !ok {
			fail("%T, want a string", v)
			return
		}
		if n, ok := schema["minLength"].(float64); ok && float64(len(str)) < n {
			fail("%q shorter than %v", str, n)
		}
		if n, ok := schema["maxLength"].(float64); ok && float64(len(str)) > n {
			fail("%q longer than %v", str, n)
		}
		if f, _ := schema["format"].(string); f == "date-time" {
			if _, err := time.Parse(time.RFC3339Nano, str); err != nil {
				fail("%q is not an RFC 3339 date-time", str)
			}
		}
	case "integer", "number":
		n, ok := v.(float64)
		if !ok {
			fail("%T, want a %s", v, t)
			return
		}
		if t == "integer" && n != math.Trunc(n) {
			fail("%v, want an integer", n)
		}
		if lo, ok := schema["minimum"].(float64); ok && n < lo {
			fail("%v below the minimum %v", n, lo)
		}
		if hi, ok := schema["maximum"].(float64); ok && n > hi {
			fail("%v above the maximum %v", n, hi)
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			fail("%T, want a boolean", v)
		}
	case "":
		// Any type (a schema of description or enum only).
	default:
		fail("schema type %q not understood", t)
	}
}

// object checks an object's required, documented and additional fields.
func (d *Doc) object(schema map[string]any, obj map[string]any, path string, errs *[]string) {
	req, _ := schema["required"].([]any)
	for _, r := range req {
		if _, ok := obj[r.(string)]; !ok {
			*errs = append(*errs, fmt.Sprintf("%s: required field %q missing", path, r))
		}
	}
	props, _ := schema["properties"].(map[string]any)
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if p, ok := props[k]; ok {
			d.validate(p, obj[k], path+"."+k, errs)
			continue
		}
		switch extra := schema["additionalProperties"].(type) {
		case map[string]any:
			d.validate(extra, obj[k], path+"."+k, errs)
		case bool:
			if !extra {
				*errs = append(*errs, fmt.Sprintf("%s: field %q not allowed", path, k))
			}
		default:
			*errs = append(*errs, fmt.Sprintf("%s: field %q not documented", path, k))
		}
	}
}
