package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/sdk"
)

// metadataScript times GETs inside a sandbox over one keep-alive
// connection to its metadata endpoint: the static index (the baseline)
// and identity tokens (signing included), alternating.
const metadataScript = `
import http.client, json, sys, time
n = int(sys.argv[1])
c = http.client.HTTPConnection("169.254.169.254", 80, timeout=10)
h = {"Nook-Metadata": "true"}
def get(path):
    t = time.perf_counter()
    c.request("GET", path, headers=h)
    r = c.getresponse()
    b = r.read()
    d = (time.perf_counter() - t) * 1000
    if r.status != 200:
        sys.exit("GET %s: %d %s" % (path, r.status, b))
    return d
for _ in range(5):
    get("/")
get("/v1/token?audience=warmup")
static, token = [], []
for _ in range(n):
    static.append(get("/"))
    token.append(get("/v1/token?audience=bench"))
print(json.dumps({"static": static, "token": token}))
`

// metadataTokens measures identity token requests from inside sandbox
// name (n of them: within the endpoint's burst of 40) beside static GETs,
// in milliseconds as the script prints them.
func metadataTokens(ctx context.Context, cl *sdk.Client, name string, n int) (token, static []time.Duration, err error) {
	var out, errb bytes.Buffer
	st, err := cl.Exec(ctx, name, api.ExecRequest{Cmd: []string{"python3", "-c", metadataScript, fmt.Sprint(n)}}, &out, &errb)
	if err != nil {
		return nil, nil, err
	}
	if st.ExitCode != 0 {
		return nil, nil, fmt.Errorf("metadata requests in the sandbox: exit %d: %s", st.ExitCode, errb.String())
	}
	var res struct{ Static, Token []float64 }
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		return nil, nil, fmt.Errorf("metadata requests in the sandbox: %w: %q", err, out.String())
	}
	return millis(res.Token), millis(res.Static), nil
}
