//! Simplestreams metadata comes from a mirror, untrusted: the index, products, mirrors and
//! mirror-info parsers must never panic, every quoted value must stay short, and whatever
//! item they accept must be verifiable (a size within the cap, a path inside the mirror).
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockstep_core::policy::Stream;
use lockstep_streams::metadata::{
    Index, IndexEntry, Products, build_catalogue, parse_mirror_info, parse_mirrors,
};
use lockstep_streams::source::check_relative_path;

/// The cap given to items; small so that fuzzed sizes cross it.
const ITEM_SIZE_BYTES_MAX: u64 = 1 << 20;

fn short(error: &lockstep_streams::MetadataError) {
    // Quotes are cut at 100 characters, plus the length note.
    assert!(error.value.chars().count() <= 140, "{error}");
    let _ = error.to_string();
}

fuzz_target!(|data: &[u8]| {
    match Index::parse("streams/v1/index2.json", data) {
        Err(error) => short(&error),
        Ok(index) => {
            for entry in &index.entries {
                assert!(check_relative_path(&entry.path).is_ok());
            }
        }
    }
    match Products::parse("streams/v1/products.json", data) {
        Err(error) => short(&error),
        Ok(products) => {
            let mut product_ids: Vec<String> =
                products.items.iter().map(|item| item.product_id.clone()).collect();
            product_ids.sort();
            product_ids.dedup();
            let entry = IndexEntry {
                content_id: products.content_id.clone(),
                stream: Stream::Devel,
                path: "streams/v1/products.json".to_owned(),
                product_ids,
                updated_unix_seconds: None,
            };
            products.check_named_by(&entry).expect("bound to its own content id");
            let mut verified = products.verify(&entry, ITEM_SIZE_BYTES_MAX);
            assert_eq!(verified.entries.len() + verified.rejected.len(), products.items.len());
            for listed in &verified.entries {
                assert!((1..=ITEM_SIZE_BYTES_MAX).contains(&listed.entry.size_bytes));
                assert!(check_relative_path(&listed.entry.path).is_ok());
                assert_eq!(listed.entry.stream, Stream::Devel);
            }
            for error in &verified.rejected {
                short(error);
            }
            let accepted = verified.entries.len();
            if let Ok(catalogue) = build_catalogue(verified.entries, &mut verified.rejected) {
                assert!(catalogue.entries().len() <= accepted);
            }
        }
    }
    if let Err(error) = parse_mirrors("streams/v1/mirrors.json", data) {
        short(&error);
    }
    if let Err(error) = parse_mirror_info("streams/v1/mirror-info.json", data) {
        short(&error);
    }
    if let Ok(text) = std::str::from_utf8(data)
        && let Some(seconds) = lockstep_streams::time::parse_rfc1123(text)
    {
        let printed = lockstep_streams::time::format_rfc1123(seconds);
        assert_eq!(lockstep_streams::time::parse_rfc1123(&printed), Some(seconds));
    }
});
