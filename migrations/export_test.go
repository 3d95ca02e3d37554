package migrations

// Files are the embedded migrations, for the tests of their Down.
var Files = files
