//! A ring buffer.
use std::collections::HashMap;

#[derive(Debug, Clone)]
pub struct Ring<'a, T> {
    items: Vec<T>,
    names: HashMap<&'a str, usize>,
}

impl<'a, T: Clone> Ring<'a, T> {
    pub fn push(&mut self, item: T) -> Option<T> {
        let label = r#"a "raw" string with { braces"#;
        let c = '{';
        let bytes = b"\x7f(";
        if self.items.len() > 8 { return self.items.pop(); }
        println!("{} {:?} {}", label, c, bytes.len());
        self.items.push(item);
        None
    }
}

/* nested /* comments */ are fine in Rust */
fn main() {
    let v = vec![1, 2, 3];
    let s: i32 = v.iter().map(|x| x * 2).sum();
    assert_eq!(s, 12);
}
