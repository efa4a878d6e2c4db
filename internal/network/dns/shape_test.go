package dns

import (
	"math/rand/v2"
	"testing"
)

// legitLabels are long labels real services use; none may be refused.
var legitLabels = []string{
	"githubusercontent", "production-github-releases", "objects-origin", "github-production-release-asset-2e65be",
	"my-loadbalancer-1234567890", "internal-my-loadbalancer-1234567890", "dualstack-myelb-1234567890",
	"pkg-containers", "registry-npmjs-org", "files-pythonhosted-org", "ubuntu-cloudimages-releases",
	"cloudfront-distribution-origin", "production-cloudflare-docker", "codeload-github-com",
	"api-sandbox-payments-eu-west", "northeurope-prod-blob-storage", "kubernetesreleasesartifacts",
	"thisisaverylonghostnamewithoutdashes", "elasticbeanstalkenvironment", "s3-accesspoint-dualstack",
	"release-assets-githubusercontent", "ec2-54-123-45-67", "ip-10-0-12-34-us-west-2", "ubuntu2204-jammy-mirror",
	"python3-packages-index", "storage-download-googleapis", "accounts-google-com-signin", "webassets-production-eu1",
	"mcr-microsoft-com-mirror", "azureedge-cdn-endpoint-westus2", "strengthsandweaknesses",
	"checkpoint-restore-artifacts", "developer-documentation-portal", "debian-security-mirror-fastly",
}

func TestRandomLabelLegit(t *testing.T) {
	for _, l := range legitLabels {
		if why := randomLabel(l, 20); why != "" {
			t.Errorf("randomLabel(%q) = %q, want a legitimate label", l, why)
		}
	}
}

func TestRandomLabelEncoded(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		name     string
		alphabet string
		minRate  float64
	}{
		{"hex", "0123456789abcdef", 1.0},
		{"base32", "abcdefghijklmnopqrstuvwxyz234567", 0.99},
		{"digits", "0123456789", 1.0},
		{"base36", "abcdefghijklmnopqrstuvwxyz0123456789", 0.99},
		{"letters", "abcdefghijklmnopqrstuvwxyz", 0.96},
	} {
		hit, total := 0, 0
		for length := 20; length <= 63; length++ {
			for range 200 {
				b := make([]byte, length)
				for i := range b {
					b[i] = tc.alphabet[rng.IntN(len(tc.alphabet))]
				}
				total++
				if randomLabel(string(b), 20) != "" {
					hit++
				}
			}
		}
		if rate := float64(hit) / float64(total); rate < tc.minRate {
			t.Errorf("%s: detected %.3f of random labels, want >= %.2f", tc.name, rate, tc.minRate)
		} else {
			t.Logf("%s: detected %.4f", tc.name, rate)
		}
	}
	if randomLabel("a1b2c3d4e5", 20) != "" {
		t.Error("labels under the minimum length are not judged")
	}
}
