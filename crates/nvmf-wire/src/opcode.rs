//! Numeric identifiers: admin and I/O opcodes, Fabrics command types, feature
//! identifiers and log page identifiers, each with `TryFrom<u8>`.

use thiserror::Error;

/// A byte that does not name any value of the enum it was converted to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("unknown {kind} {value:#04x}")]
pub struct UnknownValue {
    /// What was being converted ("admin opcode", "feature id", ...).
    pub kind: &'static str,
    /// The byte that did not match.
    pub value: u8,
}

/// Declares a `#[repr(u8)]` enum plus `TryFrom<u8>` and `From<Enum> for u8`.
macro_rules! byte_enum {
    ($(#[$m:meta])* $name:ident, $kind:literal { $( $(#[$vm:meta])* $v:ident = $n:expr, )* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum $name { $( $(#[$vm])* $v = $n, )* }

        impl TryFrom<u8> for $name {
            type Error = UnknownValue;
            fn try_from(value: u8) -> Result<Self, UnknownValue> {
                match value {
                    $( $n => Ok($name::$v), )*
                    _ => Err(UnknownValue { kind: $kind, value }),
                }
            }
        }

        impl From<$name> for u8 {
            fn from(v: $name) -> u8 {
                v as u8
            }
        }

        impl $name {
            /// Every value, in declaration order (handy for tests and tables).
            pub const ALL: &'static [$name] = &[$($name::$v,)*];
        }
    };
}

byte_enum! {
    /// Admin command set opcodes (SQE byte 0 on the admin queue).
    AdminOpcode, "admin opcode" {
        DeleteIoSq = 0x00,
        CreateIoSq = 0x01,
        GetLogPage = 0x02,
        DeleteIoCq = 0x04,
        CreateIoCq = 0x05,
        Identify = 0x06,
        Abort = 0x08,
        SetFeatures = 0x09,
        GetFeatures = 0x0a,
        AsyncEventRequest = 0x0c,
        NamespaceManagement = 0x0d,
        FirmwareCommit = 0x10,
        FirmwareDownload = 0x11,
        DeviceSelfTest = 0x14,
        NamespaceAttachment = 0x15,
        KeepAlive = 0x18,
        DirectiveSend = 0x19,
        DirectiveReceive = 0x1a,
        /// Fabrics commands share this opcode; the real command is `fctype`.
        FabricsCommand = 0x7f,
        FormatNvm = 0x80,
        SecuritySend = 0x81,
        SecurityReceive = 0x82,
        Sanitize = 0x84,
    }
}

byte_enum! {
    /// NVM command set I/O opcodes (SQE byte 0 on I/O queues).
    IoOpcode, "I/O opcode" {
        Flush = 0x00,
        Write = 0x01,
        Read = 0x02,
        WriteUncorrectable = 0x04,
        Compare = 0x05,
        WriteZeroes = 0x08,
        DatasetManagement = 0x09,
        Verify = 0x0c,
        ReservationRegister = 0x0d,
        ReservationReport = 0x0e,
        ReservationAcquire = 0x11,
        ReservationRelease = 0x15,
        /// Copy (NVM Command Set): source ranges to one destination.
        Copy = 0x19,
        /// Fabrics commands may also arrive on I/O queues (Connect, Disconnect).
        FabricsCommand = 0x7f,
    }
}

byte_enum! {
    /// Fabrics command types (SQE byte 4 when the opcode is 0x7f).
    FabricsType, "fabrics command type" {
        PropertySet = 0x00,
        Connect = 0x01,
        PropertyGet = 0x04,
        AuthSend = 0x05,
        AuthRecv = 0x06,
        Disconnect = 0x08,
    }
}

byte_enum! {
    /// Feature identifiers for Get/Set Features (CDW10 bits 7:0).
    FeatureId, "feature id" {
        Arbitration = 0x01,
        PowerManagement = 0x02,
        LbaRangeType = 0x03,
        TemperatureThreshold = 0x04,
        ErrorRecovery = 0x05,
        VolatileWriteCache = 0x06,
        NumberOfQueues = 0x07,
        InterruptCoalescing = 0x08,
        InterruptVectorConfig = 0x09,
        WriteAtomicityNormal = 0x0a,
        AsyncEventConfig = 0x0b,
        AutonomousPowerStateTransition = 0x0c,
        HostMemoryBuffer = 0x0d,
        Timestamp = 0x0e,
        KeepAliveTimer = 0x0f,
        HostControlledThermalMgmt = 0x10,
        NonOpPowerStateConfig = 0x11,
        HostIdentifier = 0x81,
        ReservationNotificationMask = 0x82,
        ReservationPersistence = 0x83,
    }
}

byte_enum! {
    /// Log page identifiers for Get Log Page (CDW10 bits 7:0).
    LogPageId, "log page id" {
        Error = 0x01,
        Smart = 0x02,
        FirmwareSlot = 0x03,
        ChangedNsList = 0x04,
        CommandsSupported = 0x05,
        DeviceSelfTest = 0x06,
        TelemetryHost = 0x07,
        TelemetryController = 0x08,
        AnaLog = 0x0c,
        Discovery = 0x70,
        ReservationNotification = 0x80,
        SanitizeStatus = 0x81,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_match_spec() {
        assert_eq!(AdminOpcode::Identify as u8, 0x06);
        assert_eq!(AdminOpcode::KeepAlive as u8, 0x18);
        assert_eq!(AdminOpcode::FabricsCommand as u8, 0x7f);
        assert_eq!(IoOpcode::Read as u8, 0x02);
        assert_eq!(IoOpcode::DatasetManagement as u8, 0x09);
        assert_eq!(FabricsType::PropertyGet as u8, 0x04);
        assert_eq!(FabricsType::Disconnect as u8, 0x08);
        assert_eq!(FeatureId::KeepAliveTimer as u8, 0x0f);
        assert_eq!(FeatureId::HostIdentifier as u8, 0x81);
        assert_eq!(LogPageId::Discovery as u8, 0x70);
    }

    #[test]
    fn try_from_round_trips() {
        for &v in AdminOpcode::ALL {
            assert_eq!(AdminOpcode::try_from(v as u8), Ok(v));
        }
        for &v in IoOpcode::ALL {
            assert_eq!(IoOpcode::try_from(u8::from(v)), Ok(v));
        }
        for &v in FabricsType::ALL {
            assert_eq!(FabricsType::try_from(v as u8), Ok(v));
        }
        for &v in FeatureId::ALL {
            assert_eq!(FeatureId::try_from(v as u8), Ok(v));
        }
        for &v in LogPageId::ALL {
            assert_eq!(LogPageId::try_from(v as u8), Ok(v));
        }
        let e = AdminOpcode::try_from(0x03).unwrap_err();
        assert_eq!(e.value, 0x03);
        assert_eq!(e.to_string(), "unknown admin opcode 0x03");
        assert!(FabricsType::try_from(0x02).is_err());
    }
}
