package openapicheck

import (
	"strings"
	"testing"
)

const doc = `{
  "openapi": "3.0.3",
  "paths": {
    "/things/{id}": {
      "get": {
        "responses": {
          "200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Thing"}}}},
          "404": {"$ref": "#/components/responses/Error"}
        }
      }
    },
    "/metrics": {"get": {"responses": {"200": {"content": {"text/plain": {"schema": {"type": "string"}}}}}}}
  },
  "components": {
    "responses": {"Error": {"content": {"application/json": {"schema": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}}}}},
    "schemas": {
      "Thing": {
        "type": "object",
        "required": ["name", "count"],
        "properties": {
          "name": {"type": "string", "minLength": 1},
          "count": {"type": "integer", "minimum": 0},
          "kind": {"type": "string", "enum": ["a", "b"]},
          "at": {"type": "string", "format": "date-time", "nullable": true},
          "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}},
          "labels": {"type": "object", "additionalProperties": {"type": "number"}}
        }
      }
    }
  }
}`

// TestCheck: a conforming answer passes; each kind of mismatch is found
// and named by its path in the body.
func TestCheck(t *testing.T) {
	d, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	const json = "application/json; charset=utf-8"
	good := `{"name": "x", "count": 3, "kind": "a", "at": null, "tags": ["p"], "labels": {"q": 1.5}}`
	if err := d.Check("GET", "/things/{id}", 200, json, []byte(good)); err != nil {
		t.Fatalf("a conforming answer: %v", err)
	}
	if err := d.Check("GET", "/things/{id}", 404, json, []byte(`{"error": "no such thing"}`)); err != nil {
		t.Fatalf("a documented error: %v", err)
	}
	if err := d.Check("GET", "/metrics", 200, "text/plain; version=0.0.4", []byte("# HELP")); err != nil {
		t.Fatalf("a text answer: %v", err)
	}
	for _, c := range []struct {
		method, path string
		status       int
		body, want   string
	}{
		{"GET", "/things/{id}", 200, `{"name": "x"}`, `$: required field "count" missing`},
		{"GET", "/things/{id}", 200, `{"name": "x", "count": 1.5}`, `$.count: 1.5, want an integer`},
		{"GET", "/things/{id}", 200, `{"name": "x", "count": -1}`, `$.count: -1 below the minimum 0`},
		{"GET", "/things/{id}", 200, `{"name": "", "count": 1}`, `$.name: "" shorter than 1`},
		{"GET", "/things/{id}", 200, `{"name": "x", "count": 1, "kind": "c"}`, `$.kind: c is not one of [a b]`},
		{"GET", "/things/{id}", 200, `{"name": "x", "count": 1, "at": "yesterday"}`, `$.at: "yesterday" is not an RFC 3339 date-time`},
		{"GET", "/things/{id}", 200, `{"name": "x", "count": 1, "tags": ["a", "b", "c"]}`, `$.tags: 3 items, want at most 2`},
		{"GET", "/things/{id}", 200, `{"name": "x", "count": 1, "tags": [1]}`, `$.tags[0]: float64, want a string`},
		{"GET", "/things/{id}", 200, `{"name": "x", "count": 1, "labels": {"q": "r"}}`, `$.labels.q: string, want a number`},
		{"GET", "/things/{id}", 200, `{"name": "x", "count": 1, "colour": "red"}`, `$: field "colour" not documented`},
		{"GET", "/things/{id}", 200, `{"name": null, "count": 1}`, `$.name: null, and the schema is not nullable`},
		{"GET", "/things/{id}", 200, `[]`, `$: []interface {}, want an object`},
		{"GET", "/things/{id}", 500, `{}`, `status 500 not documented`},
		{"PUT", "/things/{id}", 200, `{}`, `PUT /things/{id}: not documented`},
		{"GET", "/things/{id}", 200, `{`, `body is not JSON`},
		{"GET", "/things/{id}", 404, `{"message": "x"}`, `required field "error" missing`},
	} {
		err := d.Check(c.method, c.path, c.status, json, []byte(c.body))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s %d %s: %v, want %q", c.method, c.path, c.status, c.body, err, c.want)
		}
	}
	if err := d.Check("GET", "/things/{id}", 200, "text/html", []byte("<p>")); err == nil || !strings.Contains(err.Error(), `content type "text/html" not documented`) {
		t.Fatalf("an undocumented content type: %v", err)
	}
}
