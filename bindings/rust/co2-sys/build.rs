//! Finds the libco2 to link: the directory in CO2_LIB_DIR (a meson build directory, or an
//! install's lib directory), else whatever `pkg-config --libs co2` names. No crates.io
//! dependencies, so pkg-config is run as a program.

use std::env;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=CO2_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-changed=build.rs");

    if let Ok(dir) = env::var("CO2_LIB_DIR") {
        if !dir.is_empty() {
            println!("cargo:rustc-link-search=native={dir}");
            println!("cargo:rustc-link-lib=dylib=co2");
            // Exposed to dependents' build scripts as DEP_CO2_LIB_DIR (`links = "co2"`).
            println!("cargo:lib_dir={dir}");
            return;
        }
    }

    match Command::new("pkg-config").args(["--libs", "co2"]).output() {
        Ok(out) if out.status.success() => {
            let flags = String::from_utf8_lossy(&out.stdout).into_owned();
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
        _ => {
            println!(
                "cargo:warning=libco2 not located: set CO2_LIB_DIR to the directory holding \
                 libco2.so (e.g. the meson build directory), or install co2 so that \
                 `pkg-config --libs co2` finds it; trying the default linker path"
            );
            println!("cargo:rustc-link-lib=dylib=co2");
        }
    }
}
