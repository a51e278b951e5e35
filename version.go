package fenceq

// Version is the release this source tree is, a semantic version without the tag's
// leading "v" (release 0.2.0 is tagged v0.2.0). Between releases it carries the
// "-dev" suffix of the release being prepared: "0.2.0-dev" comes after 0.1.0 and
// becomes 0.2.0 when that is cut. `fenceq version` prints it; docs/versioning.md
// says what a version promises.
const Version = "0.2.0-dev"
