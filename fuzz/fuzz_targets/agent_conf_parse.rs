//! `agent.conf`: any text is parsed or refused, never a panic; what parses writes back to
//! YAML that parses to the same configuration.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockstep_agent::datadir::AgentConf;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = std::path::Path::new("agent.conf");
    let Ok(conf) = AgentConf::parse(text, path) else {
        return;
    };
    let written = conf.to_yaml().expect("a parsed agent.conf writes back");
    let again = AgentConf::parse(&written, path).expect("what was written parses");
    assert_eq!(again, conf);
});
