//! Finds the libco2 to link, in this order:
//! 1. `CO2_LIB_DIR`: a directory holding `libco2.so` (a meson build directory, or an install's
//!    lib directory);
//! 2. `pkg-config co2` (an installed co2; `PKG_CONFIG_PATH` for a prefix outside the standard
//!    ones);
//! 3. the C compiler's default library path (`cc -print-file-name=libco2.so`).
//! A libco2 that is not found, or whose version this crate cannot use, stops the build here with
//! what to do, instead of a linker error later (cargo hides the warnings of registry crates).
//! No crates.io dependencies, so pkg-config and cc are run as programs.

use std::env;
use std::path::{Path, PathBuf};
use std::process::{exit, Command};

const LIBRARY_FILE: &str = "libco2.so";

fn main() {
    for var in ["CO2_LIB_DIR", "PKG_CONFIG_PATH", "PKG_CONFIG_LIBDIR", "PKG_CONFIG_SYSROOT_DIR", "CC", "LIBRARY_PATH"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build.rs");

    // docs.rs (or any documentation-only build) has no libco2, and rustdoc links nothing.
    if env::var_os("DOCS_RS").is_some() {
        return;
    }

    if let Some(dir) = env::var_os("CO2_LIB_DIR").filter(|dir| !dir.is_empty()) {
        link_lib_dir(Path::new(&dir));
    } else if let Some(flags) = pkg_config(&["--libs", "co2"]) {
        link_pkg_config(&flags);
    } else if let Some(file) = compiler_default_library() {
        let source = format!("{} (the linker's default path)", file.display());
        check_version(library_file_version(&file).as_deref(), &source);
        println!("cargo:rustc-link-lib=dylib=co2");
    } else {
        fail(
            "libco2 not found: neither CO2_LIB_DIR is set, nor does `pkg-config --libs co2` find it \
             (is PKG_CONFIG_PATH missing the install's lib/pkgconfig?), nor is libco2.so on the \
             linker's default path. Build co2 (meson setup build && ninja -C build) and set \
             CO2_LIB_DIR=/path/to/co2/build, or `meson install` it and point PKG_CONFIG_PATH at \
             <prefix>/lib/<arch>/pkgconfig.",
        );
    }
}

fn link_lib_dir(dir: &Path) {
    let library = dir.join(LIBRARY_FILE);
    if !library.exists() {
        fail(&format!(
            "CO2_LIB_DIR={} holds no {LIBRARY_FILE}: point it at the directory where meson built \
             libco2 (the build directory, e.g. CO2_LIB_DIR=/path/to/co2/build) or at an install's \
             lib directory, or unset it to find an installed co2 through pkg-config.",
            dir.display()
        ));
    }
    check_version(library_file_version(&library).as_deref(), &format!("{} (CO2_LIB_DIR)", library.display()));
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=co2");
    // Exposed to dependents' build scripts as DEP_CO2_LIB_DIR (`links = "co2"`).
    println!("cargo:lib_dir={}", dir.display());
}

fn link_pkg_config(flags: &str) {
    let version = pkg_config(&["--modversion", "co2"]);
    check_version(version.as_deref().map(str::trim), "pkg-config's co2");
    let mut found_lib = false;
    for flag in flags.split_whitespace() {
        if let Some(dir) = flag.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={dir}");
            println!("cargo:lib_dir={dir}");
        } else if let Some(lib) = flag.strip_prefix("-l") {
            println!("cargo:rustc-link-lib=dylib={lib}");
            found_lib |= lib == "co2";
        }
    }
    if !found_lib {
        println!("cargo:rustc-link-lib=dylib=co2");
    }
}

/// What pkg-config prints for these arguments, or None when it is missing or fails.
fn pkg_config(args: &[&str]) -> Option<String> {
    let out = Command::new("pkg-config").args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// libco2.so where the C compiler (the linker driver rustc uses) finds it without -L; it
/// answers a bare file name when it has none.
fn compiler_default_library() -> Option<PathBuf> {
    // CC may carry a launcher or flags ("ccache gcc").
    let compiler = env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let mut words = compiler.split_whitespace();
    let out = Command::new(words.next().unwrap_or("cc"))
        .args(words)
        .arg(format!("-print-file-name={LIBRARY_FILE}"))
        .output()
        .ok()?;
    let printed = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (out.status.success() && printed.is_absolute() && printed.exists()).then_some(printed)
}

/// The version in the name of the file libco2.so resolves to (meson's libco2.so.MAJOR.MINOR.PATCH).
fn library_file_version(library: &Path) -> Option<String> {
    let real = std::fs::canonicalize(library).ok()?;
    let name = real.file_name()?.to_str()?;
    name.strip_prefix("libco2.so.").map(str::to_string)
}

/// This crate declares the C API of its own version: it needs a libco2 of the same major
/// version and at least its minor version, since an older library refuses the configs of a
/// newer header (docs/capi.md, "The size rule"). An unreadable version is let through: the
/// link or `co2::version()` then tells.
fn check_version(found: Option<&str>, source: &str) {
    let found = match found {
        Some(found) => found,
        None => return,
    };
    let need_major: u32 = env!("CARGO_PKG_VERSION_MAJOR").parse().unwrap();
    let need_minor: u32 = env!("CARGO_PKG_VERSION_MINOR").parse().unwrap();
    let mut parts = found.split('.').map(|part| part.parse::<u32>().ok());
    let (major, minor) = match (parts.next(), parts.next()) {
        (Some(Some(major)), Some(Some(minor))) => (major, minor),
        _ => return,
    };
    if major != need_major || minor < need_minor {
        fail(&format!(
            "{source} is libco2 {found}, but co2-sys {} needs libco2 {need_major}.x with x >= \
             {need_minor}: build or install a matching co2, or use the co2-sys release of your \
             libco2's version.",
            env!("CARGO_PKG_VERSION")
        ));
    }
}

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    exit(1);
}
