//! Names read from files that become paths (a checkpoint manifest's components, a disk replay
//! storage's leaf files): one rule, so that no such name can reach outside its folder.

/// What [`is_plain_file_name`] accepts, for error messages.
pub(crate) const PLAIN_FILE_NAME: &str =
    "a plain file name of [A-Za-z0-9_.-], not starting with '.'";

/// Whether `name` is a plain file name in its folder: non-empty, of `[A-Za-z0-9_.-]` only and
/// not starting with `.` (so no separator, no `..`, no hidden file).
pub(crate) fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}
