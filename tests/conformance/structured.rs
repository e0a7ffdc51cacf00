//! (cases to come)
