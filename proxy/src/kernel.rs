//! The oldest kernel the proxy is correct on, checked once at start so that a node below
//! it fails with one clear error instead of transactions the kernel refuses later.

/// Linux 6.2: before it, a chain a verdict map pointed to may still count as referenced
/// when the map's elements and the chain are deleted in one transaction (kube-proxy's
/// K.63), and a full sync that removes a service fails.
pub const MINIMUM: (u32, u32) = (6, 2);

/// Whether `release` (`uname -r`, `6.1.0-13-amd64`) is [`MINIMUM`] or later; `Err` names
/// what is wrong.
pub fn check_release(release: &str) -> Result<(), String> {
    let mut numbers = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(str::parse::<u32>);
    let version = match (numbers.next(), numbers.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (major, minor),
        _ => {
            return Err(format!(
                "the kernel release {release:?} does not read as a version"
            ));
        }
    };
    if version < MINIMUM {
        return Err(format!(
            "the service proxy needs Linux {}.{} or later (earlier kernels refuse to delete a \
             service's chains in the transaction that drops its map elements); this kernel \
             is {}: upgrade it (Debian 12: bookworm-backports; Ubuntu 22.04: the HWE kernel) \
             or keep kube-proxy and set proxy.enabled: false",
            MINIMUM.0,
            MINIMUM.1,
            release.trim()
        ));
    }
    Ok(())
}

/// [`check_release`] of the running kernel.
pub fn check_running() -> Result<(), String> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_err(|error| format!("reading the kernel release: {error}"))?;
    check_release(&release)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_below_6_2_are_refused_with_the_way_out() {
        for ok in ["6.2.0", "6.18.44-fc-v657", "7.0", "6.12.9-amd64\n"] {
            assert_eq!(check_release(ok), Ok(()), "{ok}");
        }
        let error = check_release("6.1.0-13-amd64").expect_err("Debian 12");
        assert!(
            error.contains("Linux 6.2") && error.contains("6.1.0-13-amd64"),
            "{error}"
        );
        assert!(check_release("5.15.0-91-generic").is_err());
        assert!(check_release("garbage").is_err());
    }
}
