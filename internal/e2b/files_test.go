package e2b

import (
	"bytes"
	"mime"
	"mime/multipart"
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestUploadFileName(t *testing.T) {
	for _, c := range []struct {
		cd, want string // want "": an error
	}{
		{`form-data; name="file"; filename="/home/user/a.txt"`, "/home/user/a.txt"},
		{`form-data; name="file"; filename="dir/sub/b.txt"`, "dir/sub/b.txt"},
		{`form-data; name="file"; filename=plain.txt`, "plain.txt"},
		{`form-data; name="file"; filename="/tmp/a \"quoted\" b.txt"`, `/tmp/a "quoted" b.txt`},
		{`form-data; name="file"; filename="/tmp/a\\b"`, `/tmp/a\b`},
		{`form-data; name="file"; filename="../../etc/passwd"`, "../../etc/passwd"},
		{`form-data; name="file"; filename="/tmp/é.txt"`, "/tmp/é.txt"},
		{`form-data; name="file"; filename*=UTF-8''%2Fhome%2Fuser%2F%C3%A9.txt`, "/home/user/é.txt"},
		{`form-data; name="file"; filename=""`, ""},
		{`form-data; name="file"`, ""},
		{`form-data; name="file"; filename="/tmp/open`, ""},
		{``, ""},
		{`form-data; name="file"; filename="/` + strings.Repeat("a", maxDispositionBytes) + `"`, ""},
	} {
		got, err := uploadFileName(c.cd)
		if c.want == "" {
			if err == nil {
				t.Errorf("uploadFileName(%q) = %q, want an error", c.cd, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("uploadFileName(%q) = %q, %v; want %q", c.cd, got, err, c.want)
		}
	}
}

// The SDKs' multipart bodies keep the whole path in the filename, which
// Part.FileName would cut.
func TestUploadFileNameMultipart(t *testing.T) {
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	names := []string{"/home/user/x/y.txt", `rel/"odd".txt`}
	for _, n := range names {
		w, _ := mw.CreateFormFile("file", n)
		w.Write([]byte("data"))
	}
	mw.Close()
	mr := multipart.NewReader(&b, mw.Boundary())
	for _, n := range names {
		part, err := mr.NextPart()
		if err != nil {
			t.Fatal(err)
		}
		got, err := uploadFileName(part.Header.Get("Content-Disposition"))
		if err != nil || got != n {
			t.Errorf("filename %q: got %q, %v", n, got, err)
		}
	}
}

func FuzzUploadFileName(f *testing.F) {
	for _, s := range []string{
		`form-data; name="file"; filename="/home/user/a.txt"`,
		`form-data; name="file"; filename="a \"b\" c"`,
		`form-data; name="file"; filename*=UTF-8''%C3%A9`,
		`form-data; name="file"; filename=""`,
		`form-data; filename="../x"`,
		`attachment`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, cd string) {
		name, err := uploadFileName(cd)
		if err != nil {
			return
		}
		if name == "" {
			t.Fatalf("uploadFileName(%q) gave an empty name without an error", cd)
		}
		// What the name is, a client can send again.
		if again := mime.FormatMediaType("form-data", map[string]string{"name": "file", "filename": name}); again != "" {
			if got, err := uploadFileName(again); err != nil || got != name {
				t.Fatalf("%q: %q formatted as %q parses as %q, %v", cd, name, again, got, err)
			}
		}
	})
}

func TestFileSignature(t *testing.T) {
	// Computed as the JS SDK does: "v1_" + btoa(sha256(raw)) without "=".
	for _, c := range []struct{ p, op, user, token, exp, want string }{
		{"/home/user/a.txt", "read", "user", "tok2", "", "v1_OdSQqbSEAIKn6UrMrZBr0r9r8a3uLap+bRaEcRzDlWw"},
		{"/home/user/a.txt", "write", "", "tok2", "1700000000", "v1_2ZzdvG+8ch/QYNUJyJYxo3b0lGlML0IVkRxVpN22MiA"},
	} {
		if got := fileSignature(c.p, c.op, c.user, c.token, c.exp); got != c.want {
			t.Errorf("fileSignature(%q, %q, %q, %q, %q) = %q, want %q", c.p, c.op, c.user, c.token, c.exp, got, c.want)
		}
	}
}

func TestCheckSignature(t *testing.T) {
	signers := []signer{{"sb1", "tok1"}, {"sb2", "tok2"}, {"sb3", "tok3"}}
	now := time.Unix(1700000000, 0)
	sign := func(p, user, sig, exp string) url.Values {
		q := url.Values{"path": {p}, "signature": {sig}}
		if user != "" {
			q.Set("username", user)
		}
		if exp != "" {
			q.Set("signature_expiration", exp)
		}
		return q
	}
	for _, c := range []struct {
		name    string
		q       url.Values
		op      string
		want    string
		wantErr string
	}{
		{"good", sign("/a", "user", fileSignature("/a", "read", "user", "tok2", ""), ""), "read", "sb2", ""},
		{"default user", sign("/a", "", fileSignature("/a", "write", "", "tok3", ""), ""), "write", "sb3", ""},
		{"future expiration", sign("/a", "", fileSignature("/a", "read", "", "tok1", "1700000100"), "1700000100"), "read", "sb1", ""},
		{"expired", sign("/a", "", fileSignature("/a", "read", "", "tok1", "1699999999"), "1699999999"), "read", "", "signature is already expired"},
		{"other operation", sign("/a", "", fileSignature("/a", "read", "", "tok1", ""), ""), "write", "", "invalid signature"},
		{"other path", sign("/b", "", fileSignature("/a", "read", "", "tok1", ""), ""), "read", "", "invalid signature"},
		{"other user", sign("/a", "root", fileSignature("/a", "read", "user", "tok1", ""), ""), "read", "", "invalid signature"},
		{"unknown token", sign("/a", "", fileSignature("/a", "read", "", "tok9", ""), ""), "read", "", "invalid signature"},
		{"expiration changed", sign("/a", "", fileSignature("/a", "read", "", "tok1", "1700000100"), "1700000200"), "read", "", "invalid signature"},
		{"expiration dropped", sign("/a", "", fileSignature("/a", "read", "", "tok1", "1700000100"), ""), "read", "", "invalid signature"},
		{"bad expiration", sign("/a", "", "v1_x", "soon"), "read", "", "invalid signature_expiration"},
		{"no signature", sign("/a", "", "", ""), "read", "", "invalid signature"},
	} {
		got, err := checkSignature(signers, c.q, c.op, now)
		switch {
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("%s: got %q, %v; want error %q", c.name, got, err, c.wantErr)
		case c.wantErr == "" && (err != nil || got != c.want):
			t.Errorf("%s: got %q, %v; want %q", c.name, got, err, c.want)
		}
	}
	if _, err := checkSignature(nil, sign("/a", "", fileSignature("/a", "read", "", "", ""), ""), "read", now); err == nil {
		t.Error("a signature matched with no sandbox")
	}
}

func TestAcceptsGzip(t *testing.T) {
	for h, want := range map[string]bool{
		"":                  false,
		"gzip":              true,
		"gzip, deflate, br": true,
		"br, GZIP;q=0.5":    true,
		"gzip;q=0":          false,
		"gzip; q=0.000":     false,
		"identity":          false,
		"*":                 false,
		"deflate, x-gzip":   true,
		"gzip;level=1;q=0":  false,
		"gzip;q=bad":        false,
	} {
		if got := acceptsGzip(h); got != want {
			t.Errorf("acceptsGzip(%q) = %v, want %v", h, got, want)
		}
	}
}
