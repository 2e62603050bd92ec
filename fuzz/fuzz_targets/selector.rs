//! Selector parsing: never panics, and whatever parses prints back to itself.
#![no_main]

use flagd_proxy::selector;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match selector::parse(text) {
        Ok(key) => {
            let printed = key.to_string();
            assert_eq!(printed, text.trim());
            assert_eq!(selector::parse(&printed), Ok(key));
        }
        Err(error) => {
            // Errors stay bounded whatever the client sent: the selector is cut to 300 bytes
            // before it is quoted, and quoting escapes a character into at most 10.
            assert!(error.to_string().len() < 1_000);
        }
    }
});
