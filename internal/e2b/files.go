package e2b

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/daemon"
	"github.com/nookhq/nook/internal/errdefs"
)

// envd's /files: a file's bytes down (GET) and up (POST), by the sandbox
// headers and access token, or by a signed URL (serveSigned).

// Limits on what an upload may make the edge read.
const (
	maxUploadParts      = 1000
	maxDispositionBytes = 16 << 10 // a part's Content-Disposition (a path of 4096 bytes, %-encoded)
)

// uploadedFile is an entry of POST /files's answer.
type uploadedFile struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

// fileFail answers a /files error: as fail does, but a full disk is 507
// (the SDKs' NotEnoughSpaceError).
func (s *Server) fileFail(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, errdefs.ErrResourceExhausted) {
		writeError(w, http.StatusInsufficientStorage, err.Error())
		return
	}
	s.fail(w, r, err)
}

// fileUser is the user a /files request names: its username parameter,
// else the request's.
func fileUser(r *http.Request) string {
	if q := r.URL.Query(); q.Has("username") {
		return q.Get("username")
	}
	return targetOf(r.Context()).user
}

// acceptsGzip reports whether an Accept-Encoding value takes gzip.
func acceptsGzip(h string) bool {
	for _, c := range strings.Split(h, ",") {
		name, params, _ := strings.Cut(c, ";")
		name = strings.ToLower(strings.TrimSpace(name))
		if name != "gzip" && name != "x-gzip" {
			continue
		}
		ok := true
		for _, p := range strings.Split(params, ";") {
			if v, isQ := strings.CutPrefix(strings.ToLower(strings.TrimSpace(p)), "q="); isQ {
				q, err := strconv.ParseFloat(v, 64)
				ok = err == nil && q > 0
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// downloadFile is envd's GET /files: the file's bytes, gzipped if the
// client takes gzip.
func (s *Server) downloadFile(w http.ResponseWriter, r *http.Request) {
	t := targetOf(r.Context())
	p, err := resolvePath(fileUser(r), r.URL.Query().Get("path"))
	if err != nil {
		s.fileFail(w, r, err)
		return
	}
	info, rc, err := s.m.ReadFile(r.Context(), t.sb.Name, p, 0, 0)
	if err != nil {
		s.fileFail(w, r, err)
		return
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	if cd := mime.FormatMediaType("inline", map[string]string{"filename": path.Base(p)}); cd != "" {
		h.Set("Content-Disposition", cd)
	}
	h.Set("Vary", "Accept-Encoding")
	gz := acceptsGzip(r.Header.Get("Accept-Encoding"))
	if gz {
		h.Set("Content-Encoding", "gzip")
	} else {
		h.Set("Content-Length", strconv.FormatInt(info.Size, 10))
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	if gz {
		zw := gzip.NewWriter(w)
		_, err = io.Copy(zw, rc)
		if err == nil {
			err = zw.Close()
		}
	} else {
		_, err = io.Copy(w, rc)
	}
	if err != nil {
		// Cut the response: a clean end would pass for the whole file.
		s.log.Debug("e2b file download cut", "sandbox", t.sb.Name, "path", p, "err", err)
		panic(http.ErrAbortHandler)
	}
}

// uploadFile is envd's POST /files: a multipart body of parts named
// "file", each written to its filename (a path; the path parameter if
// given), or an application/octet-stream body written to path. Either may
// be gzipped (Content-Encoding). Missing parents are made. The answer
// lists the files written, in order.
func (s *Server) uploadFile(w http.ResponseWriter, r *http.Request) {
	t := targetOf(r.Context())
	q := r.URL.Query()
	user := fileUser(r)
	md := uploadMetadata(r.Header)
	body := io.Reader(r.Body)
	switch ce := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); ce {
	case "", "identity":
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			writeError(w, http.StatusBadRequest, "the body is not gzip: "+err.Error())
			return
		}
		defer zr.Close()
		body = zr
	default:
		writeError(w, http.StatusBadRequest, "Content-Encoding "+strconv.Quote(ce)+" is not supported: use gzip or none")
		return
	}
	var files []uploadedFile
	var err error
	ct, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch {
	case ct == "application/octet-stream":
		if !q.Has("path") {
			writeError(w, http.StatusBadRequest, "an application/octet-stream upload needs the path parameter")
			return
		}
		var p string
		var f uploadedFile
		if p, err = resolvePath(user, q.Get("path")); err == nil {
			f, err = s.writeUpload(r.Context(), t, user, p, md, body)
			files = []uploadedFile{f}
		}
	case strings.HasPrefix(ct, "multipart/") && params["boundary"] != "":
		files, err = s.uploadParts(r.Context(), t, user, md, q, multipart.NewReader(body, params["boundary"]))
	default:
		writeError(w, http.StatusBadRequest, "Content-Type "+strconv.Quote(ct)+" is not supported: use multipart/form-data or application/octet-stream")
		return
	}
	if err != nil {
		s.fileFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, files)
}

// uploadParts writes a multipart upload's files, in order.
func (s *Server) uploadParts(ctx context.Context, t target, user string, md map[string]string, q url.Values, mr *multipart.Reader) ([]uploadedFile, error) {
	var files []uploadedFile
	for n := 0; ; n++ {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, errdefs.Invalid("reading the multipart body: %v", err)
		}
		if n == maxUploadParts {
			return nil, errdefs.Invalid("an upload has at most %d parts", maxUploadParts)
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		dest := q.Get("path")
		if !q.Has("path") {
			if dest, err = uploadFileName(part.Header.Get("Content-Disposition")); err != nil {
				return nil, err
			}
		}
		p, err := resolvePath(user, dest)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			if f.Path == p {
				return nil, errdefs.Invalid("you cannot upload multiple files to the same path %s in one request: only the first was written", p)
			}
		}
		f, err := s.writeUpload(ctx, t, user, p, md, part)
		part.Close()
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		return nil, errdefs.Invalid("the multipart body has no part named file")
	}
	return files, nil
}

// uploadFileName is the filename of a multipart part's
// Content-Disposition: the SDKs send the destination path there, which
// multipart.Part.FileName would cut to its base name.
func uploadFileName(disposition string) (string, error) {
	if len(disposition) > maxDispositionBytes {
		return "", errdefs.Invalid("a part's Content-Disposition is longer than %d bytes", maxDispositionBytes)
	}
	_, params, err := mime.ParseMediaType(disposition)
	if err != nil {
		return "", errdefs.Invalid("a part's Content-Disposition is not valid: %v", err)
	}
	name := params["filename"]
	if name == "" {
		return "", errdefs.Invalid("a part named file has no filename in its Content-Disposition: give the destination path there, or the path parameter")
	}
	return name, nil
}

// writeUpload writes one uploaded file to p, making its parents, both
// owned by user as envd gives them (an overwritten file keeps its
// owner).
func (s *Server) writeUpload(ctx context.Context, t target, user, p string, md map[string]string, r io.Reader) (uploadedFile, error) {
	if _, err := s.m.WriteFile(ctx, t.sb.Name, p, daemon.WriteOptions{Parents: true, Owner: user, Metadata: md}, r); err != nil {
		return uploadedFile{}, err
	}
	return uploadedFile{Path: p, Name: path.Base(p), Type: "file"}, nil
}

// signer is a sandbox that may have signed a /files URL, by its access
// token.
type signer struct{ sandbox, token string }

// fileSignature is how envd and the SDKs sign a /files URL: "v1_" and the
// unpadded base64 of sha256("path:operation:user:token[:expiration]").
func fileSignature(p, op, user, token, exp string) string {
	raw := p + ":" + op + ":" + user + ":" + token
	if exp != "" {
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// checkSignature finds which sandbox signed a /files URL (q) for op
// ("read" or "write"): the URL names no sandbox, so each one's token is
// tried. It fails for a signature none made, or one expired at now.
func checkSignature(signers []signer, q url.Values, op string, now time.Time) (string, error) {
	var exp int64
	var expStr string
	if q.Has("signature_expiration") {
		var err error
		if exp, err = strconv.ParseInt(q.Get("signature_expiration"), 10, 64); err != nil {
			return "", errors.New("invalid signature_expiration: give a Unix time in seconds")
		}
		expStr = strconv.FormatInt(exp, 10)
	}
	sig := []byte(q.Get("signature"))
	found := ""
	for _, sg := range signers {
		want := fileSignature(q.Get("path"), op, q.Get("username"), sg.token, expStr)
		if subtle.ConstantTimeCompare(sig, []byte(want)) == 1 {
			found = sg.sandbox
		}
	}
	switch {
	case found == "":
		return "", errors.New("invalid signature")
	case expStr != "" && exp < now.Unix():
		return "", errors.New("signature is already expired")
	}
	return found, nil
}

// serveSigned serves /files by a signed URL (the SDKs' downloadUrl and
// uploadUrl), which carries no sandbox header and no token: the sandbox
// is the one whose token made the signature.
func (s *Server) serveSigned(w http.ResponseWriter, r *http.Request) {
	op := "read"
	switch r.Method {
	case http.MethodGet, http.MethodHead:
	case http.MethodPost:
		op = "write"
	default:
		writeError(w, http.StatusMethodNotAllowed, "a signed /files URL takes GET or POST")
		return
	}
	sbs, err := s.m.List(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	signers := make([]signer, len(sbs))
	for i, sb := range sbs {
		signers[i] = signer{sb.ID, s.accessToken(sb.ID)}
	}
	id, err := checkSignature(signers, r.URL.Query(), op, time.Now())
	if err != nil {
		writeError(w, http.StatusUnauthorized, err.Error())
		return
	}
	var sb *core.Sandbox
	for _, c := range sbs {
		if c.ID == id {
			sb = c
		}
	}
	if sb.State != core.StateRunning {
		notRunning(w, sb.Name, "The sandbox is "+string(sb.State))
		return
	}
	r = r.WithContext(context.WithValue(daemon.LookOnly(r.Context()), sandboxKey{}, target{sb: sb, user: s.m.DefaultUser(sb)}))
	if op == "read" {
		s.downloadFile(w, r)
	} else {
		s.uploadFile(w, r)
	}
}

// uploadMetadata is an upload's X-Metadata-KEY headers, which the file
// keeps as its user.KEY extended attributes (keys in lower case: HTTP's
// header names have none); nil if none.
func uploadMetadata(h http.Header) map[string]string {
	var md map[string]string
	for name, vs := range h {
		key, ok := strings.CutPrefix(strings.ToLower(name), "x-metadata-")
		if !ok || key == "" || len(vs) == 0 {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = vs[0]
	}
	return md
}
