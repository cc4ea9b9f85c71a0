//! A vector that keeps up to `N` elements in place and spills to the heap beyond: the SGE
//! lists and inline data of work requests, so that posting the common WR (a few SGEs, a short
//! inline message) allocates nothing.

use core::fmt;
use core::ops::{Deref, DerefMut};

/// Up to `N` `Copy` elements in place, more on the heap. Dereferences to a slice.
#[derive(Clone)]
pub struct SmallVec<T: Copy + Default, const N: usize> {
    repr: Repr<T, N>,
}

#[derive(Clone)]
enum Repr<T: Copy + Default, const N: usize> {
    Inline { len: usize, buf: [T; N] },
    Heap(Vec<T>),
}

impl<T: Copy + Default, const N: usize> SmallVec<T, N> {
    /// An empty vector (no allocation).
    pub fn new() -> Self {
        SmallVec {
            repr: Repr::Inline {
                len: 0,
                buf: [T::default(); N],
            },
        }
    }

    /// A copy of `items`: in place if they fit, else one allocation.
    pub fn from_slice(items: &[T]) -> Self {
        if items.len() <= N {
            let mut buf = [T::default(); N];
            buf[..items.len()].copy_from_slice(items);
            SmallVec {
                repr: Repr::Inline {
                    len: items.len(),
                    buf,
                },
            }
        } else {
            SmallVec {
                repr: Repr::Heap(items.to_vec()),
            }
        }
    }

    /// `n` copies of `value`: in place if they fit, else one allocation.
    pub fn filled(n: usize, value: T) -> Self {
        if n <= N {
            SmallVec {
                repr: Repr::Inline {
                    len: n,
                    buf: [value; N],
                },
            }
        } else {
            SmallVec {
                repr: Repr::Heap(vec![value; n]),
            }
        }
    }

    /// Appends `item`, moving to the heap when the place is full.
    pub fn push(&mut self, item: T) {
        match &mut self.repr {
            Repr::Inline { len, buf } if *len < N => {
                buf[*len] = item;
                *len += 1;
            }
            Repr::Inline { len, buf } => {
                let mut v = Vec::with_capacity(N * 2);
                v.extend_from_slice(&buf[..*len]);
                v.push(item);
                self.repr = Repr::Heap(v);
            }
            Repr::Heap(v) => v.push(item),
        }
    }

    /// Appends every element of `items`.
    pub fn extend_from_slice(&mut self, items: &[T]) {
        match &mut self.repr {
            Repr::Inline { len, buf } if *len + items.len() <= N => {
                buf[*len..*len + items.len()].copy_from_slice(items);
                *len += items.len();
            }
            Repr::Inline { len, buf } => {
                let mut v = Vec::with_capacity(*len + items.len());
                v.extend_from_slice(&buf[..*len]);
                v.extend_from_slice(items);
                self.repr = Repr::Heap(v);
            }
            Repr::Heap(v) => v.extend_from_slice(items),
        }
    }

    /// Whether the elements live on the heap (more than `N` of them were ever held).
    pub fn spilled(&self) -> bool {
        matches!(self.repr, Repr::Heap(_))
    }
}

impl<T: Copy + Default, const N: usize> Default for SmallVec<T, N> {
    fn default() -> Self {
        SmallVec::new()
    }
}

impl<T: Copy + Default, const N: usize> Deref for SmallVec<T, N> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.repr {
            Repr::Inline { len, buf } => &buf[..*len],
            Repr::Heap(v) => v,
        }
    }
}

impl<T: Copy + Default, const N: usize> DerefMut for SmallVec<T, N> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.repr {
            Repr::Inline { len, buf } => &mut buf[..*len],
            Repr::Heap(v) => v,
        }
    }
}

impl<T: Copy + Default, const N: usize> From<Vec<T>> for SmallVec<T, N> {
    fn from(v: Vec<T>) -> Self {
        if v.len() <= N {
            SmallVec::from_slice(&v)
        } else {
            SmallVec {
                repr: Repr::Heap(v),
            }
        }
    }
}

impl<T: Copy + Default, const N: usize> From<&[T]> for SmallVec<T, N> {
    fn from(v: &[T]) -> Self {
        SmallVec::from_slice(v)
    }
}

impl<T: Copy + Default, const N: usize, const M: usize> From<[T; M]> for SmallVec<T, N> {
    fn from(v: [T; M]) -> Self {
        SmallVec::from_slice(&v)
    }
}

impl<T: Copy + Default, const N: usize> FromIterator<T> for SmallVec<T, N> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut s = SmallVec::new();
        for x in iter {
            s.push(x);
        }
        s
    }
}

impl<'a, T: Copy + Default, const N: usize> IntoIterator for &'a SmallVec<T, N> {
    type Item = &'a T;
    type IntoIter = core::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<T: Copy + Default + PartialEq, const N: usize> PartialEq for SmallVec<T, N> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Copy + Default + Eq, const N: usize> Eq for SmallVec<T, N> {}

impl<T: Copy + Default + fmt::Debug, const N: usize> fmt::Debug for SmallVec<T, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_in_place_up_to_n_then_spills_keeping_order() {
        let mut v: SmallVec<u32, 3> = SmallVec::new();
        for i in 0..3 {
            v.push(i);
        }
        assert!(!v.spilled());
        assert_eq!(&*v, &[0, 1, 2]);
        v.push(3);
        v.extend_from_slice(&[4, 5]);
        assert!(v.spilled());
        assert_eq!(&*v, &[0, 1, 2, 3, 4, 5]);
        let w: SmallVec<u32, 3> = vec![0, 1, 2, 3, 4, 5].into();
        assert_eq!(v, w);
        let small: SmallVec<u32, 3> = vec![7].into();
        assert!(!small.spilled());
        let mut e: SmallVec<u8, 4> = SmallVec::new();
        e.extend_from_slice(&[1, 2, 3]);
        e.extend_from_slice(&[4, 5]);
        assert_eq!(&*e, &[1, 2, 3, 4, 5]);
        assert_eq!(format!("{:?}", SmallVec::<u8, 2>::from([9u8])), "[9]");
        assert_eq!(&*SmallVec::<u8, 2>::filled(2, 7), &[7, 7]);
        assert!(SmallVec::<u8, 2>::filled(3, 0).spilled());
    }
}
