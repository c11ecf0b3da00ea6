package admin

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestOpenAPIMatchesRoutes(t *testing.T) {
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi version %q", doc.OpenAPI)
	}
	var documented []string
	for p, ops := range doc.Paths {
		for m := range ops {
			if m == "parameters" || m == "summary" || m == "description" {
				continue
			}
			documented = append(documented, strings.ToUpper(m)+" "+p)
		}
	}
	slices.Sort(documented)
	var registered []string
	for _, rt := range routes {
		registered = append(registered, rt.method+" "+rt.path)
	}
	slices.Sort(registered)
	if !reflect.DeepEqual(documented, registered) {
		t.Fatalf("documented %v\nregistered %v", documented, registered)
	}

	// Every documented operation is served: neither 404 nor 405.
	e := newEnv(t, 0)
	for _, op := range documented {
		method, path, _ := strings.Cut(op, " ")
		path = strings.ReplaceAll(path, "{id}", "probe")
		req := httptest.NewRequest(method, path, strings.NewReader(`{"limit":1,"window":"1s"}`))
		req.Header.Set("Authorization", "Bearer "+testToken)
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		e.srv.Handler().ServeHTTP(w, req)
		if w.Code == http.StatusMethodNotAllowed || strings.Contains(w.Body.String(), "no such route") {
			t.Errorf("%s %s: %d %s", method, path, w.Code, w.Body)
		}
	}

	// The served document is the embedded one.
	r := e.do("GET", "/api/v1/openapi.json", "", map[string]string{"Authorization": ""})
	if r.status != 200 || string(r.body) != string(openAPI) {
		t.Fatalf("openapi.json served %d, %d bytes", r.status, len(r.body))
	}
}
