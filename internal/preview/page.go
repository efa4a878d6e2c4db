package preview

import (
	"encoding/json"
	"html/template"
	"net/http"
	"strconv"
	"strings"
)

// pageTmpl is the HTML of the server's own answers. It runs on the
// preview's origin, so it has no script, and says so (CSP).
var pageTmpl = template.Must(template.New("page").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>{{.Code}} {{.Status}} · nook preview</title>
<style>body{font:16px/1.5 system-ui,sans-serif;max-width:40em;margin:4em auto;padding:0 1em;color:#222}h1{font-size:1.4em}code{background:#f2f2f2;padding:.1em .3em;border-radius:3px}</style>
</head><body><h1>{{.Code}} {{.Status}}</h1>
<p>{{range .Parts}}{{if .Code}}<code>{{.Text}}</code>{{else}}{{.Text}}{{end}}{{end}}</p>
<p><small>nook preview</small></p>
</body></html>
`))

type pagePart struct {
	Text string
	Code bool
}

type pageData struct {
	Code   int
	Status string
	Parts  []pagePart
}

// page answers with the server's own page: HTML, or JSON for a client
// that accepts application/json ({"error": msg, "code": code}). In msg,
// `backquoted` text is a command, shown as code.
func (s *Server) page(w http.ResponseWriter, r *http.Request, code int, msg string) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	if wantsJSON(r) {
		h.Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(struct {
			Error string `json:"error"`
			Code  int    `json:"code"`
		}{msg, code})
		return
	}
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	w.WriteHeader(code)
	d := pageData{Code: code, Status: http.StatusText(code)}
	for i, t := range strings.Split(msg, "`") {
		if t != "" {
			d.Parts = append(d.Parts, pagePart{Text: t, Code: i%2 == 1})
		}
	}
	if d.Status == "" {
		d.Status = "Status " + strconv.Itoa(code)
	}
	if err := pageTmpl.Execute(w, d); err != nil && r.Context().Err() == nil {
		s.log.Debug("preview: writing a page failed", "err", err)
	}
}

// wantsJSON tells whether the client accepts application/json.
func wantsJSON(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for part := range strings.SplitSeq(v, ",") {
			mt, _, _ := strings.Cut(part, ";")
			if strings.EqualFold(strings.TrimSpace(mt), "application/json") {
				return true
			}
		}
	}
	return false
}
