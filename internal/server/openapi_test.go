package server

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/errdefs"
)

// loadOpenAPI parses and validates the embedded spec.
func loadOpenAPI(t *testing.T) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(api.OpenAPISpec)
	if err != nil {
		t.Fatalf("parse api/openapi.yaml: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("api/openapi.yaml is not a valid OpenAPI 3 document: %v", err)
	}
	return doc
}

func TestOpenAPIValid(t *testing.T) {
	doc := loadOpenAPI(t)
	if doc.OpenAPI != "3.0.3" {
		t.Errorf("openapi version %q, want 3.0.3", doc.OpenAPI)
	}
	if doc.Components == nil || doc.Components.SecuritySchemes["bearerAuth"] == nil {
		t.Fatal("components.securitySchemes.bearerAuth is missing")
	}
	if ss := doc.Components.SecuritySchemes["bearerAuth"].Value; ss.Type != "http" || ss.Scheme != "bearer" {
		t.Errorf("bearerAuth is %s/%s, want http/bearer", ss.Type, ss.Scheme)
	}
}

// TestOpenAPIRoutes checks that the spec documents exactly the server's routes.
func TestOpenAPIRoutes(t *testing.T) {
	doc := loadOpenAPI(t)
	inSpec := map[string]bool{}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			inSpec[method+" "+path] = true
		}
	}
	inCode := map[string]bool{}
	for _, p := range (&Server{}).Routes() {
		method, path, ok := strings.Cut(p, " ")
		if !ok {
			t.Errorf("route pattern %q has no method", p)
			continue
		}
		inCode[method+" "+path] = true
	}
	for _, r := range sortedKeys(inCode) {
		if !inSpec[r] {
			t.Errorf("route %s is not documented in api/openapi.yaml", r)
		}
	}
	for _, r := range sortedKeys(inSpec) {
		if !inCode[r] {
			t.Errorf("api/openapi.yaml documents %s, which the server does not serve", r)
		}
	}
}

// TestOpenAPIOperations checks each operation's path parameters and error responses.
func TestOpenAPIOperations(t *testing.T) {
	doc := loadOpenAPI(t)
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			name := method + " " + path
			// Every {param} in the path is declared as a required path parameter.
			declared := map[string]bool{}
			for _, params := range []openapi3.Parameters{item.Parameters, op.Parameters} {
				for _, p := range params {
					if p.Value.In == openapi3.ParameterInPath && p.Value.Required {
						declared[p.Value.Name] = true
					}
				}
			}
			for _, seg := range strings.Split(path, "/") {
				if strings.HasPrefix(seg, "{") && !declared[strings.Trim(seg, "{}")] {
					t.Errorf("%s: path parameter %s is not declared", name, seg)
				}
			}
			hasSuccess := false
			for code, resp := range op.Responses.Map() {
				if strings.HasPrefix(code, "2") || code == "101" { // 101: a WebSocket upgrade
					hasSuccess = true
					continue
				}
				mt := resp.Value.Content.Get("application/json")
				if mt == nil || mt.Schema == nil || mt.Schema.Ref != "#/components/schemas/ErrorBody" {
					t.Errorf("%s: response %s is not an application/json ErrorBody", name, code)
				}
			}
			if !hasSuccess {
				t.Errorf("%s: no 2xx response", name)
			}
			// The TCP listener refuses any request without a token, but
			// for the public routes (security: []).
			if op.Responses.Value("401") == nil && (op.Security == nil || len(*op.Security) > 0) {
				t.Errorf("%s: no 401 response", name)
			}
		}
	}
}

// TestOpenAPIErrorCodes checks that the Error.code enum lists the stable codes.
func TestOpenAPIErrorCodes(t *testing.T) {
	doc := loadOpenAPI(t)
	want := apiErrorCodes(t)
	var got []string
	for _, v := range schema(t, doc, "Error").Properties["code"].Value.Enum {
		got = append(got, v.(string))
	}
	sort.Strings(want)
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Errorf("Error.code enum %v, want %v", got, want)
	}
}

// TestOpenAPIRequestBodiesClosed checks that every request body schema
// forbids unknown fields, as the server's decoder does.
func TestOpenAPIRequestBodiesClosed(t *testing.T) {
	doc := loadOpenAPI(t)
	n := 0
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if op.RequestBody == nil {
				continue
			}
			for ct, mt := range op.RequestBody.Value.Content {
				if ct != "application/json" {
					continue // raw bytes (file content, tar streams) are not decoded as JSON
				}
				n++
				s := mt.Schema.Value
				if s.AdditionalProperties.Has == nil || *s.AdditionalProperties.Has || s.AdditionalProperties.Schema != nil {
					t.Errorf("%s %s: request body %s schema does not have additionalProperties: false", method, path, ct)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no request bodies found")
	}
}

// TestOpenAPISchemasMatchTypes checks each component schema against its Go
// type: the same JSON field names, compatible types, and required exactly
// for fields without omitempty.
func TestOpenAPISchemasMatchTypes(t *testing.T) {
	doc := loadOpenAPI(t)
	for name, v := range map[string]any{
		"Sandbox":               api.Sandbox{},
		"CreateSandboxRequest":  api.CreateSandboxRequest{},
		"SetTTLRequest":         api.SetTTLRequest{},
		"ExecRequest":           api.ExecRequest{},
		"ExitStatus":            api.ExitStatus{},
		"Template":              api.Template{},
		"TemplateRecipe":        api.TemplateRecipe{},
		"TemplateList":          api.TemplateList{},
		"TemplateLayer":         api.TemplateLayer{},
		"TemplateService":       api.TemplateService{},
		"ImageConfig":           api.ImageConfig{},
		"BuildTemplateRequest":  api.BuildTemplateRequest{},
		"BuildEvent":            api.BuildEvent{},
		"BuildLayerEvent":       api.BuildLayerEvent{},
		"Token":                 api.Token{},
		"CreateTokenRequest":    api.CreateTokenRequest{},
		"TokenQuotas":           api.TokenQuotas{},
		"TokenUsage":            api.TokenUsage{},
		"Backend":               api.Backend{},
		"Capabilities":          api.Capabilities{},
		"Info":                  api.Info{},
		"RuncInfo":              api.RuncInfo{},
		"RuncAdvisory":          api.RuncAdvisory{},
		"WarmPool":              api.WarmPool{},
		"SandboxStats":          api.SandboxStats{},
		"Error":                 api.Error{},
		"ErrorBody":             api.ErrorBody{},
		"FileInfo":              api.FileInfo{},
		"FileList":              api.FileList{},
		"FileEvent":             api.FileEvent{},
		"Event":                 api.Event{},
		"MkdirRequest":          api.MkdirRequest{},
		"MoveRequest":           api.MoveRequest{},
		"ChmodRequest":          api.ChmodRequest{},
		"Network":               api.Network{},
		"SetNetworkRequest":     api.SetNetworkRequest{},
		"ExposeRequest":         api.ExposeRequest{},
		"ExposedPort":           api.ExposedPort{},
		"SSHKey":                api.SSHKey{},
		"AddSSHKeyRequest":      api.AddSSHKeyRequest{},
		"SSHCertRequest":        api.SSHCertRequest{},
		"SSHCert":               api.SSHCert{},
		"SSHInfo":               api.SSHInfo{},
		"PreviewInfo":           api.PreviewInfo{},
		"NetLogEntry":           api.NetLogEntry{},
		"NetLog":                api.NetLog{},
		"Snapshot":              api.Snapshot{},
		"CreateSnapshotRequest": api.CreateSnapshotRequest{},
		"RollbackRequest":       api.RollbackRequest{},
		"ForkRequest":           api.ForkRequest{},
		"ForkResponse":          api.ForkResponse{},
	} {
		t.Run(name, func(t *testing.T) {
			checkSchema(t, schema(t, doc, name), reflect.TypeOf(v))
		})
	}
}

func schema(t *testing.T, doc *openapi3.T, name string) *openapi3.Schema {
	t.Helper()
	ref := doc.Components.Schemas[name]
	if ref == nil || ref.Value == nil {
		t.Fatalf("components.schemas.%s is missing", name)
	}
	return ref.Value
}

func checkSchema(t *testing.T, s *openapi3.Schema, typ reflect.Type) {
	t.Helper()
	if !s.Type.Is(openapi3.TypeObject) {
		t.Errorf("type %v, want object", s.Type)
	}
	fields := map[string]bool{}
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		tag := f.Tag.Get("json")
		jname, opts, _ := strings.Cut(tag, ",")
		if jname == "" || jname == "-" {
			t.Fatalf("field %s has no json name", f.Name)
		}
		fields[jname] = true
		p := s.Properties[jname]
		if p == nil || p.Value == nil {
			t.Errorf("property %s (field %s) is missing", jname, f.Name)
			continue
		}
		checkType(t, jname, p.Value, f.Type)
		omitempty := strings.Contains(","+opts+",", ",omitempty,")
		if req := slices.Contains(s.Required, jname); req == omitempty {
			t.Errorf("property %s: required=%v, but the field has omitempty=%v", jname, req, omitempty)
		}
	}
	for p := range s.Properties {
		if !fields[p] {
			t.Errorf("property %s has no field in %s", p, typ)
		}
	}
	for _, r := range s.Required {
		if !fields[r] {
			t.Errorf("required %s has no field in %s", r, typ)
		}
	}
}

var timeType = reflect.TypeOf(time.Time{})

func checkType(t *testing.T, name string, s *openapi3.Schema, typ reflect.Type) {
	t.Helper()
	want, format := "", ""
	if typ.Kind() == reflect.Pointer { // omitempty: absent when nil
		typ = typ.Elem()
	}
	switch {
	case typ == timeType:
		want, format = openapi3.TypeString, "date-time"
	case typ.Kind() == reflect.String:
		want = openapi3.TypeString
	case typ.Kind() == reflect.Bool:
		want = openapi3.TypeBoolean
	case typ.Kind() == reflect.Int64:
		want, format = openapi3.TypeInteger, "int64"
	case typ.Kind() == reflect.Int, typ.Kind() == reflect.Uint16:
		want = openapi3.TypeInteger
	case typ.Kind() == reflect.Float64:
		want = openapi3.TypeNumber
	case typ.Kind() == reflect.Slice:
		want = openapi3.TypeArray
	case typ.Kind() == reflect.Map, typ.Kind() == reflect.Struct:
		want = openapi3.TypeObject
	default:
		t.Fatalf("property %s: no check for Go type %s", name, typ)
	}
	if !s.Type.Is(want) {
		t.Errorf("property %s: type %v, want %s (Go %s)", name, s.Type, want, typ)
	}
	if format != "" && s.Format != format {
		t.Errorf("property %s: format %q, want %q (Go %s)", name, s.Format, format, typ)
	}
	switch typ.Kind() {
	case reflect.Map:
		as := s.AdditionalProperties.Schema
		if typ.Key().Kind() != reflect.String || as == nil || as.Value == nil {
			t.Errorf("property %s: a map needs additionalProperties with a schema", name)
			return
		}
		checkType(t, name+"[]", as.Value, typ.Elem())
	case reflect.Slice:
		if s.Items == nil || s.Items.Value == nil {
			t.Errorf("property %s: an array needs items", name)
			return
		}
		checkType(t, name+"[]", s.Items.Value, typ.Elem())
	case reflect.Struct:
		if typ != timeType {
			checkSchema(t, s, typ)
		}
	}
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestOpenAPIErrorStatuses checks the spec's table of codes and statuses against errorStatus.
func TestOpenAPIErrorStatuses(t *testing.T) {
	doc := loadOpenAPI(t)
	for _, err := range []error{
		errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrAlreadyExists, errdefs.ErrFailedPrecondition,
		errdefs.ErrResourceExhausted, errdefs.ErrLimit, errdefs.ErrUnavailable, errdefs.ErrPermissionDenied, errors.New("other"),
	} {
		status, code := errorStatus(err)
		if row := fmt.Sprintf("| `%s` | %d |", code, status); !strings.Contains(doc.Info.Description, row) {
			t.Errorf("info.description lacks the row %q", row)
		}
	}
	if row := fmt.Sprintf("| `%s` | %d |", api.CodeUnauthorized, http.StatusUnauthorized); !strings.Contains(doc.Info.Description, row) {
		t.Errorf("info.description lacks the row %q", row)
	}
}

// apiErrorCodes reads every Code* constant from the api package's source,
// so that a code added there without documenting it fails the test.
func apiErrorCodes(t *testing.T) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "../../api/types.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var codes []string
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if strings.HasPrefix(name.Name, "Code") && i < len(vs.Values) {
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok {
						v, _ := strconv.Unquote(lit.Value)
						codes = append(codes, v)
					}
				}
			}
		}
	}
	if len(codes) < 8 {
		t.Fatalf("found only %d error codes in api/types.go", len(codes))
	}
	return codes
}
