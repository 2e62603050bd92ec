//! Markdown tables: named, aligned columns and a row of cells per line; and the tables of
//! figures, a row per figure and a column per result.

/// A figure: its name, its value (`None`: not measured) and the digits it is shown with.
pub(crate) type Figure = (String, Option<f64>, usize);

/// A figure named `name`.
pub(crate) fn figure(name: &str, value: Option<f64>, digits: usize) -> Figure {
    (name.to_owned(), value, digits)
}

/// A count as a figure's value.
pub(crate) fn count<N: TryInto<u64>>(n: N) -> Option<f64> {
    n.try_into().ok().map(|n| n as f64)
}

/// `figures` with no values: the rows of a part of a result that is not there.
pub(crate) fn absent(mut figures: Vec<Figure>) -> Vec<Figure> {
    figures.iter_mut().for_each(|figure| figure.1 = None);
    figures
}

/// `v` with `digits` decimals, or "–" where there is none.
pub(crate) fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map(|v| format!("{v:.digits$}"))
        .unwrap_or_else(|| "–".to_owned())
}

/// Whether a target is met: "yes", "**no**", or "–" where it was not measured.
pub(crate) fn met_cell(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => "–",
    }
}

/// A Markdown table, its header written, its rows added one by one.
pub(crate) struct Table {
    text: String,
}

impl Table {
    /// A table of the columns `names`; `aligns` has a letter per column, `l` (left) or `r`
    /// (right), its last letter standing for the columns it has none for.
    pub(crate) fn new<S: AsRef<str>>(names: impl IntoIterator<Item = S>, aligns: &str) -> Self {
        let mut table = Table {
            text: String::new(),
        };
        let mut rule = String::from("|");
        let mut last = 'l';
        let mut letters = aligns.chars();
        let names: Vec<S> = names.into_iter().collect();
        for _ in &names {
            last = letters.next().unwrap_or(last);
            rule.push_str(if last == 'r' { "---:|" } else { "---|" });
        }
        table.row(names);
        table.text.push_str(&rule);
        table.text.push('\n');
        table
    }

    /// A table of the columns of `header`, the Markdown header line without its outer bars
    /// ("a | b | c"); `aligns` as in [`Table::new`].
    pub(crate) fn of(header: &str, aligns: &str) -> Self {
        Table::new(header.split(" | "), aligns)
    }

    /// A row of cells; an empty cell stands as a blank.
    pub(crate) fn row<S: AsRef<str>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.text.push('|');
        for cell in cells {
            match cell.as_ref() {
                "" => self.text.push_str(" |"),
                cell => {
                    self.text.push(' ');
                    self.text.push_str(cell);
                    self.text.push_str(" |");
                }
            }
        }
        self.text.push('\n');
    }

    /// A row of a name and its figures: the first cell, then each value shown with `digits`.
    pub(crate) fn figure_row(&mut self, name: &str, values: &[Option<f64>], digits: usize) {
        let cells = values.iter().map(|v| fmt_opt(*v, digits));
        self.row(std::iter::once(name.to_owned()).chain(cells));
    }

    /// The table in Markdown, a line a row.
    pub(crate) fn markdown(self) -> String {
        self.text
    }
}

/// A table of figures: a column per result (named, with its figures, all in the same order),
/// a row per figure; `blank` leaves out the rows no result has a value for, `aligns` as in
/// [`Table::new`].
pub(crate) fn figure_table(columns: &[(&str, Vec<Figure>)], blank: Blank, aligns: &str) -> Table {
    let names = std::iter::once("").chain(columns.iter().map(|(name, _)| *name));
    let mut table = Table::new(names, aligns);
    let Some((_, first)) = columns.first() else {
        return table;
    };
    for (i, (name, _, digits)) in first.iter().enumerate() {
        let values: Vec<Option<f64>> = columns.iter().map(|(_, figures)| figures[i].1).collect();
        if blank == Blank::Skip && values.iter().all(Option::is_none) {
            continue;
        }
        table.figure_row(name, &values, *digits);
    }
    table
}

/// What a table of figures does with a row no result has a value for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Blank {
    Keep,
    Skip,
}

#[cfg(test)]
mod tests {
    use super::{Blank, Table, figure_table};

    #[test]
    fn a_table_has_its_header_rule_and_rows() {
        let mut table = Table::new(["", "a", "b"], "lr");
        table.row(["x", "1", ""]);
        assert_eq!(
            table.markdown(),
            "| | a | b |\n|---|---:|---:|\n| x | 1 | |\n"
        );
    }

    #[test]
    fn a_figure_table_leaves_out_empty_rows_when_asked() {
        let figures =
            |v: Option<f64>| vec![("one".to_owned(), Some(1.0), 1), ("none".to_owned(), v, 0)];
        let columns = [("p", figures(None)), ("q", figures(None))];
        let skipped = figure_table(&columns, Blank::Skip, "lr").markdown();
        assert_eq!(
            skipped,
            "| | p | q |\n|---|---:|---:|\n| one | 1.0 | 1.0 |\n"
        );
        let kept = figure_table(&columns, Blank::Keep, "lr").markdown();
        assert!(kept.ends_with("| none | – | – |\n"), "{kept}");
    }
}
