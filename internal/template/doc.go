// Package template builds and keeps the read-only file trees sandboxes
// start from.
//
// # The store
//
// Each build is immutable and kept in its own directory,
// <dir>/<name>/<build-id>/, with its template.json (source, image
// reference and digest, the canonical REPO@DIGEST a rebuild without
// --pull resolves, platform, layers, the image's config and service, the
// cache keys of a Dockerfile build's layers). <dir>/<name>/current names
// the build new sandboxes use. A sandbox records the build it was
// created from, so a rebuild never changes what is under a running
// sandbox; builds no sandbox uses are removed (GC, Remove), and OnRemove
// tells the daemon, whose backends then drop what they made of the build
// (a vm's root image and snapshots). A failed first build leaves no
// directory of its template (dropNameless).
//
// # Three sources, one form
//
//   - A Recipe (mmdebstrap: base, dev) builds a rootfs directory.
//   - An image (BuildImage: a registry reference, oci:DIR,
//     docker-archive:FILE, through internal/image) is its layers: each is
//     unpacked once into the layer store at <dir>/.layers
//     (internal/layerstore, keyed by chain ID, shared by every build
//     whose stack below it is the same), and the build's layers.json
//     lists them topmost first, over a stored layer of the base
//     directories a sandbox needs.
//   - A Dockerfile (BuildDockerfile: BuildKit's parser and instruction
//     types; no BuildKit daemon) is layers too: FROM an image, a template
//     or a stage; each RUN runs in a sandbox the daemon makes over the
//     stage's layers (Runner), whose changes become the step's layer;
//     COPY/ADD, WORKDIR and the base directories make layers in the
//     store directly, at destinations resolved through the stage's own
//     symlinks inside its tree (resolveIn: an absolute link starts again
//     at the tree's root, ".." stops there). Every layer is keyed by a hash of the stack below
//     it and the step as expanded (build args it uses, digests of what it
//     copies), so a rebuild reruns from the first step that changed.
//
// Containers mount a build's layers as their overlay lowers (Layers);
// Rootfs gives a merged directory of hard links to the stored files,
// made on first use, for what needs one tree (a vm's mkfs.ext4 -d, the
// systemd check). GCLayers removes layers no build names; builds hold its
// lock shared from their first layer to their commit, a GC takes it
// alone or skips.
//
// # Config and service
//
// The image's ENV, USER and WORKDIR (checked: entries the agent would
// refuse are dropped with a warning) are the exec defaults of the
// template's sandboxes; its ENTRYPOINT and CMD, or --start, are the
// template's service, with --ready (ParseReady) saying what a create
// waits for. The daemon starts it (internal/daemon/service.go); a vm
// template's snapshot has it running already.
//
// # Progress
//
// Builds write their progress as lines: each layer pulled and unpacked
// (or cached) with its size and rate, every progressEvery a line for a
// layer still coming (or one saying no byte has come, and what the build
// waits for), each Dockerfile step and its output. OnLayer and OnPull
// report the same as events (the API streams them as NDJSON; the CLI
// draws a bar per layer on a terminal).
package template
