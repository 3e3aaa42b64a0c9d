//! Keyword tokens: how a goal (or a goal template) is cut into the words
//! whose sets Jaccard similarity compares. [`tokenize`] is the one
//! definition; the Python reference (`tests/native/reference.py`) follows it.

use std::collections::HashSet;

/// Keyword tokens of `text`, unique, in order of first appearance.
///
/// ASCII `A-Z` are lowercased (nothing else is); then tokens are the
/// leftmost-first matches of `\{[a-z0-9_]+\}|[a-z0-9_]+`: placeholders such
/// as `{file_path}` stay one token with their braces, and any other
/// character separates tokens.
pub fn tokenize(text: &str) -> Vec<String> {
    let lowered = text.to_ascii_lowercase();
    let bytes = lowered.as_bytes();
    let is_word = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_';
    let run_end = |from: usize| {
        let mut end = from;
        while end < bytes.len() && is_word(bytes[end]) {
            end += 1;
        }
        end
    };
    let mut seen = HashSet::new();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let (start, end) = if bytes[i] == b'{' {
            let end = run_end(i + 1);
            if end > i + 1 && bytes.get(end) == Some(&b'}') {
                (i, end + 1)
            } else {
                i += 1;
                continue;
            }
        } else if is_word(bytes[i]) {
            (i, run_end(i))
        } else {
            i += 1;
            continue;
        };
        // Token boundaries are ASCII bytes, so this slice is on char
        // boundaries.
        let token = &lowered[start..end];
        if seen.insert(token) {
            tokens.push(token.to_owned());
        }
        i = end;
    }
    tokens
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenize_rules() {
        assert_eq!(
            tokenize("Deploy {file_path} to {url}"),
            ["deploy", "{file_path}", "to", "{url}"]
        );
        assert_eq!(
            tokenize("Process {N} records"),
            ["process", "{n}", "records"]
        );
        assert_eq!(tokenize("the THE The tHe"), ["the"]);
        assert_eq!(
            tokenize("snake_case and kebab-case"),
            ["snake_case", "and", "kebab", "case"]
        );
        assert_eq!(tokenize("py311 utf-8 3.5"), ["py311", "utf", "8", "3", "5"]);
        assert_eq!(tokenize("{} {a b} {ab"), ["a", "b", "ab"]);
        assert_eq!(tokenize("{{x}} x"), ["{x}", "x"]);
        assert_eq!(tokenize("ab{cd}ef"), ["ab", "{cd}", "ef"]);
        assert_eq!(tokenize("{A-B}"), ["a", "b"]);
        assert_eq!(tokenize(""), Vec::<String>::new());
        assert_eq!(tokenize("  \t\n!!"), Vec::<String>::new());
    }

    #[test]
    fn tokenize_is_ascii_only() {
        // Non-ASCII characters separate tokens and are never lowercased
        // (not even the KELVIN SIGN, which str.lower() maps to 'k').
        assert_eq!(tokenize("Straße café"), ["stra", "e", "caf"]);
        assert_eq!(tokenize("\u{212A}elvin"), ["elvin"]);
        assert_eq!(tokenize("ÀB"), ["b"]);
    }
}
