//! `podca completions`: shell completions and the man pages, generated from the clap
//! definitions, so they can never disagree with the flags `podca` accepts; the pages' EXAMPLES,
//! ENVIRONMENT and FILES come from `podca_authority::cli_pages`.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::CommandFactory;
use clap::builder::Resettable::Reset;
use clap_complete::Shell;
use podca_authority::cli_pages;

use crate::cli::Cli;

/// The shells `podca completions` writes for.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

impl From<CompletionShell> for Shell {
    fn from(shell: CompletionShell) -> Self {
        match shell {
            CompletionShell::Bash => Shell::Bash,
            CompletionShell::Zsh => Shell::Zsh,
            CompletionShell::Fish => Shell::Fish,
        }
    }
}

#[derive(Debug, clap::Args)]
#[command(after_help = podca_authority::cli_pages::examples_help("completions"))]
pub struct CompletionsArgs {
    /// The shell to write completions for.
    #[arg(value_enum, required_unless_present = "man", conflicts_with = "man")]
    pub shell: Option<CompletionShell>,
    /// Write the man page podca(1) (roff) instead; with --out-dir, every page.
    #[arg(long)]
    pub man: bool,
    /// With --man: write podca.1 and a page per subcommand (podca-ca-init.1, …) into this
    /// directory, and print their paths.
    #[arg(long, value_name = "DIR", conflicts_with = "shell")]
    pub out_dir: Option<PathBuf>,
}

impl CompletionsArgs {
    pub fn run(self) -> anyhow::Result<()> {
        // --man is required without a shell, and conflicts with one.
        let Self {
            shell,
            man: _,
            out_dir,
        } = self;
        // The man pages have no page for `help`, so they must not point to one.
        let mut cmd = Cli::command().disable_help_subcommand(shell.is_none());
        cmd.build();
        // Rendered into memory first: clap_complete panics on a failed write (a closed pipe),
        // and a write error here should be one line like every other podca error.
        let mut text = Vec::new();
        match (shell, out_dir) {
            (Some(shell), _) => {
                let name = cmd.get_name().to_string();
                clap_complete::generate(Shell::from(shell), &mut cmd, name, &mut text);
            }
            (None, None) => text = render(&cmd, "")?,
            (None, Some(dir)) => {
                for (command, page) in pages(&cmd, "") {
                    let name = page.get_display_name().unwrap_or(page.get_name());
                    let path = dir.join(format!("{name}.1"));
                    std::fs::write(&path, render(&page, &command)?)
                        .with_context(|| format!("writing {}", path.display()))?;
                    writeln!(text, "{}", path.display())?;
                }
            }
        }
        let mut out = std::io::stdout().lock();
        out.write_all(&text)
            .and_then(|()| out.flush())
            .context("writing to standard output")?;
        Ok(())
    }
}

/// `cmd` and every subcommand below it, with its path after `podca` (`ca init`).
fn pages(cmd: &clap::Command, path: &str) -> Vec<(String, clap::Command)> {
    let mut all = vec![(path.to_owned(), cmd.clone())];
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let sub_path = format!("{path} {}", sub.get_name());
        all.extend(pages(sub, sub_path.trim_start()));
    }
    all
}

/// A page: NAME to OPTIONS (and SUBCOMMANDS) from clap, then podca's own sections.
fn render(cmd: &clap::Command, command: &str) -> anyhow::Result<Vec<u8>> {
    let page = cli_pages::page(command)
        .with_context(|| format!("no man page sections for `podca {command}` (cli_pages.rs)"))?;
    let flag_env: Vec<(String, String)> = (cmd.get_arguments())
        .filter_map(|a| Some((a.get_env()?.to_str()?.to_owned(), a.get_long()?.to_owned())))
        .collect();
    // Its examples are EXAMPLES here, and the version is in the title line.
    let cmd = cmd.clone().after_help(Reset).version(Reset);
    let mut out = Vec::new();
    let source = concat!("podca ", env!("CARGO_PKG_VERSION"));
    clap_mangen::Man::new(cmd).source(source).render(&mut out)?;
    out.extend(cli_pages::sections(page, &flag_env).into_bytes());
    Ok(out)
}
