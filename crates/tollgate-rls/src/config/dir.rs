//! A configuration directory: every `*.yaml` / `*.yml` file under it (hidden files and directories skipped, so a
//! Kubernetes ConfigMap's `..data` copies are not read twice), loaded in path order.

use std::fmt;
use std::path::{Path, PathBuf};

use super::{LoadError, Loader, RateLimitConfig};

/// A directory of configuration files and the loader that reads them.
#[derive(Debug, Clone)]
pub struct ConfigDir {
    path: PathBuf,
    loader: Loader,
}

/// The files' names (relative to the directory) and contents, in load order: what a reload compares.
pub(crate) type Snapshot = Vec<(String, String)>;

impl ConfigDir {
    /// The files under `path`, read by `loader`.
    #[must_use]
    pub fn new(path: impl Into<PathBuf>, loader: Loader) -> Self {
        Self {
            path: path.into(),
            loader,
        }
    }

    /// The directory.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads and loads every file.
    pub fn load(&self) -> Result<RateLimitConfig, DirError> {
        let snapshot = self.read()?;
        self.load_snapshot(&snapshot)
    }

    pub(crate) fn load_snapshot(&self, snapshot: &Snapshot) -> Result<RateLimitConfig, DirError> {
        self.loader
            .load(
                snapshot
                    .iter()
                    .map(|(name, text)| (name.as_str(), text.as_str())),
            )
            .map_err(DirError::Config)
    }

    /// The directory's files and contents now.
    pub(crate) fn read(&self) -> Result<Snapshot, DirError> {
        let mut files = Vec::new();
        collect(&self.path, &self.path, &mut files)?;
        files.sort();
        files
            .into_iter()
            .map(|name| {
                let path = self.path.join(&name);
                std::fs::read_to_string(&path)
                    .map(|text| (name, text))
                    .map_err(|e| DirError::Io(path, e.to_string()))
            })
            .collect()
    }
}

fn collect(root: &Path, dir: &Path, files: &mut Vec<String>) -> Result<(), DirError> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| DirError::Io(dir.to_owned(), e.to_string()))?;
    for entry in entries {
        let entry = entry.map_err(|e| DirError::Io(dir.to_owned(), e.to_string()))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        // Follows symbolic links, as a ConfigMap's files are.
        let meta =
            std::fs::metadata(&path).map_err(|e| DirError::Io(path.clone(), e.to_string()))?;
        if meta.is_dir() {
            collect(root, &path, files)?;
        } else if meta.is_file() && (name.ends_with(".yaml") || name.ends_with(".yml")) {
            let relative = path.strip_prefix(root).unwrap_or(&path);
            files.push(relative.to_string_lossy().into_owned());
        }
    }
    Ok(())
}

/// Why a directory could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirError {
    /// A file or directory could not be read.
    Io(PathBuf, String),
    /// A file is not a valid configuration.
    Config(LoadError),
}

impl fmt::Display for DirError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(path, e) => write!(f, "{}: {e}", path.display()),
            Self::Config(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for DirError {}
