//! Juju bundles: any text is parsed or refused with an error, never a panic; a bundle that
//! parses yields a plan whose every change names an application of the bundle.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockstep_agent::cli::bundle::{Bundle, BundleChange};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(bundle) = Bundle::parse(text) else {
        return;
    };
    let names: Vec<&str> = bundle.applications.iter().map(|a| a.name.as_str()).collect();
    for change in bundle.plan() {
        match change {
            BundleChange::Deploy { application, .. } | BundleChange::Expose { application } => {
                assert!(names.contains(&application.as_str()), "{application}");
            }
            BundleChange::AddRelation { endpoints } => {
                for endpoint in &endpoints {
                    let application = endpoint.split(':').next().unwrap_or("");
                    assert!(names.contains(&application), "{endpoint}");
                }
            }
        }
    }
});
