//! `podca completions`: shell completions and the man page, generated from the clap
//! definitions, so they can never disagree with the flags `podca` accepts.

use std::io::Write;

use anyhow::Context;
use clap::CommandFactory;
use clap_complete::Shell;

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
#[command(after_help = "Examples:\n  \
    podca completions bash > /etc/bash_completion.d/podca\n  \
    podca completions zsh > \"${fpath[1]}/_podca\"\n  \
    podca completions fish > ~/.config/fish/completions/podca.fish\n  \
    podca completions --man > /usr/local/share/man/man1/podca.1")]
pub struct CompletionsArgs {
    /// The shell to write completions for.
    #[arg(value_enum, required_unless_present = "man", conflicts_with = "man")]
    pub shell: Option<CompletionShell>,
    /// Write the man page podca(1) (roff) instead.
    #[arg(long)]
    pub man: bool,
}

impl CompletionsArgs {
    pub fn run(self) -> anyhow::Result<()> {
        let Self { shell, man } = self;
        let mut cmd = Cli::command();
        // Rendered into memory first: clap_complete panics on a failed write (a closed pipe),
        // and a write error here should be one line like every other podca error.
        let mut text = Vec::new();
        if man {
            clap_mangen::Man::new(cmd)
                .render(&mut text)
                .context("rendering the man page")?;
        } else if let Some(shell) = shell {
            let name = cmd.get_name().to_string();
            clap_complete::generate(Shell::from(shell), &mut cmd, name, &mut text);
        }
        let mut out = std::io::stdout().lock();
        out.write_all(&text)
            .and_then(|()| out.flush())
            .context("writing to standard output")?;
        Ok(())
    }
}
