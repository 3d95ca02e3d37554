// Package blob stores rendered ticket PDFs (and other small immutable blobs)
// on the local filesystem.
//
// [FS] maps slash-separated keys such as "tickets/SD-4471.pdf" to files
// below a root directory. Keys are validated strictly (see [FS.Put]) so a key
// can never name a file outside the root. Writes are atomic: a reader, a
// crash or a concurrent writer of the same key sees either the old or the
// new content, never a mixture or a partial file.
//
// Names beginning with "." are reserved for the store's temporary files, so
// no key segment may start with a dot, and [FS.List] never reports them.
package blob
